//! `xagg counters`: the dataplane's counters, summed over CPUs.

use std::path::Path;

use anyhow::Result;
use xagg_api::{call, Request, Response};

use crate::daemon::answer;

pub fn run(socket: &Path, json: bool) -> Result<()> {
    match call(socket, &Request::Counters)? {
        Response::Counters { counters } if json => {
            println!("{}", serde_json::to_string_pretty(&counters)?);
            Ok(())
        }
        Response::Counters { counters } => {
            for (k, v) in counters {
                println!("{k:>18} {v}");
            }
            Ok(())
        }
        r => answer(r),
    }
}
