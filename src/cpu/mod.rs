//! CPU reference (the oracle).
