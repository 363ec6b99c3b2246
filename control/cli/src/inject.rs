//! `xagg inject`: fault injection in the dataplane.

use std::path::Path;

use anyhow::Result;
use xagg_api::{call, Request};

use crate::daemon::answer;

pub fn run(socket: &Path, drop_contrib: f64, drop_result: f64) -> Result<()> {
    answer(call(
        socket,
        &Request::Inject {
            drop_contribution: drop_contrib,
            drop_result,
        },
    )?)
}
