//! `xagg inject`: fault injection in the dataplane.

use std::path::Path;

use anyhow::Result;
use xagg_api::{call, Faults, Request, Response};

use crate::daemon::answer;

/// The injection in force, as `xagg inject` and `xagg status` say it.
pub fn describe(f: &Faults) -> String {
    if f.drop_contribution == 0.0 && f.drop_result == 0.0 {
        return "fault injection: off".into();
    }
    format!(
        "fault injection: ON, dropping {:.1} % of contributions and {:.1} % of result copies (counted as inject_drop_*; `xagg inject` with no options turns it off)",
        100.0 * f.drop_contribution,
        100.0 * f.drop_result
    )
}

/// Sets both fractions (an option left out is 0: the call says the whole setting).
pub fn run(socket: &Path, drop_contrib: f64, drop_result: f64) -> Result<()> {
    let f = Faults {
        drop_contribution: drop_contrib,
        drop_result,
    };
    match call(
        socket,
        &Request::Inject {
            drop_contribution: drop_contrib,
            drop_result,
        },
    )? {
        Response::Ok => {
            println!("{}", describe(&f));
            Ok(())
        }
        r => answer(r),
    }
}
