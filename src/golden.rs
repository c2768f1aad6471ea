//! Golden cases.
