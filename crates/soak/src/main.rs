//! `interlock-soak`: runs the chaos soak and prints its report.

fn main() {}
