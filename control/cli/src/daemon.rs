//! What the subcommands share in talking to the daemon.

use anyhow::{bail, Result};
use xagg_api::Response;

/// A plain answer from the daemon as a result: `Ok`, or its error, or an answer that does
/// not belong to the request.
pub fn answer(r: Response) -> Result<()> {
    match r {
        Response::Ok => Ok(()),
        Response::Error { message } => bail!("{message}"),
        other => bail!("unexpected answer from the daemon: {other:?}"),
    }
}
