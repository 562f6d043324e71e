//! The one error type of the library and the status codes it maps onto.
//!
//! Every [`Error`] variant corresponds to exactly one C status
//! (`ORBITE_STATUS_*`); [`Status`] holds the frozen numeric values. Both are
//! generated from the one table in `status_table.rs`, which also gives the
//! C header its constants.

use std::fmt;

/// Builds [`Status`] and [`Error`] from the one status table.
macro_rules! status_table {
    ($( $name:ident = $value:literal, $cname:literal, $doc:literal $(, $err:ident($what:literal))? ; )*) => {
        /// Status codes, numerically identical to the C `ORBITE_STATUS_*`
        /// constants (both come from `src/status_table.rs`).
        #[repr(u32)]
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize)]
        #[serde(rename_all = "SCREAMING_SNAKE_CASE")]
        pub enum Status {
            $( #[doc = $doc] $name = $value, )*
        }

        const STATUS_COUNT: usize = [$($value),*].len();

        impl Status {
            /// Every status, in numeric order.
            pub const ALL: [Status; STATUS_COUNT] = [$(Status::$name),*];

            /// The C constant name, e.g. `"ORBITE_STATUS_OK"`.
            pub fn c_name(self) -> &'static str {
                self.c_name_cstr().to_str().unwrap_or("ORBITE_STATUS_UNKNOWN")
            }

            /// The C constant name as a NUL-terminated string (static storage).
            pub fn c_name_cstr(self) -> &'static std::ffi::CStr {
                match self {
                    $( Status::$name => const {
                        match std::ffi::CStr::from_bytes_with_nul(concat!("ORBITE_STATUS_", $cname, "\0").as_bytes()) {
                            Ok(c) => c,
                            Err(_) => panic!("a status name holds a NUL"),
                        }
                    }, )*
                }
            }
        }

        /// Errors of the OrbiTE engine. Each variant maps one-to-one onto a
        /// failing [`Status`]; the text names the cause (argument, key, limit,
        /// peer).
        #[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
        pub enum Error {
            $( $( #[doc = $doc] #[error("{}: {}", $what, .0)] $err(String), )? )*
        }

        impl Error {
            /// The status this error maps onto.
            pub fn status(&self) -> Status {
                match self {
                    $( $( Error::$err(_) => Status::$name, )? )*
                }
            }

            /// Builds the error for a failing `status` with `message`.
            /// `Ok` and `Pending` are not failures; they map to `InvalidArgument`.
            pub fn from_status(status: Status, message: impl Into<String>) -> Error {
                let m = message.into();
                match status {
                    $( $( Status::$name => Error::$err(m), )? )*
                    Status::Ok | Status::Pending => Error::InvalidArgument(m),
                }
            }

            /// The message without the status prefix.
            pub fn message(&self) -> &str {
                match self {
                    $( $( Error::$err(m) => m, )? )*
                }
            }
        }
    };
}

include!("status_table.rs");

impl Status {
    /// The status for a raw value, if it is one.
    pub fn from_u32(v: u32) -> Option<Status> {
        Status::ALL.get(v as usize).copied()
    }
}

impl fmt::Display for Status {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.c_name())
    }
}

impl Error {
    /// The same error with `what` (the call or peer it concerns) before its
    /// message; the status is kept.
    pub fn context(self, what: &str) -> Error {
        Error::from_status(self.status(), format!("{what}: {}", self.message()))
    }

    /// An I/O error with context.
    pub fn io(context: &str, e: &std::io::Error) -> Error {
        Error::Io(format!("{context}: {e}"))
    }
}

/// Result alias used throughout the crate.
pub type Result<T> = std::result::Result<T, Error>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn statuses_are_dense_and_round_trip() {
        for (i, s) in Status::ALL.iter().enumerate() {
            assert_eq!(*s as u32, i as u32);
            assert_eq!(Status::from_u32(i as u32), Some(*s));
        }
        assert_eq!(Status::from_u32(21), None);
    }

    #[test]
    fn every_failing_status_maps_back_from_its_error() {
        for s in Status::ALL.iter().skip(2) {
            assert_eq!(Error::from_status(*s, "x").status(), *s);
        }
    }
}
