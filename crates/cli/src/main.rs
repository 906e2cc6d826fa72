//! `interlock`: the node agent and the command line.
fn main() {}
