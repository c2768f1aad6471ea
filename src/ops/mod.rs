//! Device launchers.
