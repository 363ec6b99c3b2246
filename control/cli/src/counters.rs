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
            // Names right-aligned to the longest, counts to the widest.
            let name = counters.keys().map(String::len).max().unwrap_or(0);
            let count = counters
                .values()
                .map(|v| v.to_string().len())
                .max()
                .unwrap_or(0);
            for (k, v) in counters {
                println!("{k:>name$} {v:>count$}");
            }
            Ok(())
        }
        r => answer(r),
    }
}
