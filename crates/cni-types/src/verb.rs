//! The CNI verbs (`CNI_COMMAND`): what a runtime asks a plugin to do.

use std::fmt;

/// A CNI verb.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Command {
    /// Attach a container.
    Add,
    /// Detach a container.
    Del,
    /// Verify an attachment (0.4.0+).
    Check,
    /// Clean up everything not in the valid attachments (1.1.0+).
    Gc,
    /// Is the plugin ready to ADD (1.1.0+).
    Status,
    /// Which spec versions the plugin supports.
    Version,
}

impl Command {
    /// The `CNI_COMMAND` value.
    pub fn as_str(self) -> &'static str {
        match self {
            Command::Add => "ADD",
            Command::Del => "DEL",
            Command::Check => "CHECK",
            Command::Gc => "GC",
            Command::Status => "STATUS",
            Command::Version => "VERSION",
        }
    }
}

impl fmt::Display for Command {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl std::str::FromStr for Command {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Ok(match s {
            "ADD" => Command::Add,
            "DEL" => Command::Del,
            "CHECK" => Command::Check,
            "GC" => Command::Gc,
            "STATUS" => Command::Status,
            "VERSION" => Command::Version,
            other => return Err(format!("unknown CNI_COMMAND {other:?}")),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_verb_round_trips_through_its_name() {
        for c in [
            Command::Add,
            Command::Del,
            Command::Check,
            Command::Gc,
            Command::Status,
            Command::Version,
        ] {
            assert_eq!(c.as_str().parse::<Command>().unwrap(), c);
            assert_eq!(c.to_string(), c.as_str());
        }
        assert!("add".parse::<Command>().is_err());
    }
}
