//! The microVM monitor. Empty until the microVM runtime is built: the crate
//! exists so the workspace layout is final and the daemon can depend on it.
