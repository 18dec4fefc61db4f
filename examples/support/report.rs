//! What an example's `main` returns on error: the error and its causes as sentences
//! (`Display`), rather than the debug structure Rust prints for a `Box<dyn Error>`.

use std::error::Error;
use std::fmt;

/// An error on its way out of `main`.
pub struct Report(Box<dyn Error>);

impl<E: Into<Box<dyn Error>>> From<E> for Report {
    fn from(error: E) -> Self {
        Report(error.into())
    }
}

/// Rust prints the error `main` returns with `Debug`: here, the message and each cause.
impl fmt::Debug for Report {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut said = self.0.to_string();
        write!(f, "{said}")?;
        let mut cause = self.0.source();
        while let Some(error) = cause {
            // A cause the message already quotes is not repeated.
            let text = error.to_string();
            if !said.contains(&text) {
                write!(f, "\n  caused by: {text}")?;
                said = text;
            }
            cause = error.source();
        }
        Ok(())
    }
}
