//! The interlock node agent.
//!
//! Installs the plugin binary, writes the config the runtime actually loads, re-converges
//! it within milliseconds after anyone else touches the conf dir, and reports readiness
//! truthfully (health endpoints and the STATUS marker the plugin reads).
