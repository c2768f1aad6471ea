//! The exported HIP runtime C ABI: devices, memory, streams, events, modules, launches.
