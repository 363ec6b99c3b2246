//! xaggd — the aggregation switch daemon: loads and attaches the XDP dataplane on the
//! configured ports, and serves the local API the `xagg` CLI uses.

use std::{
    path::PathBuf,
    sync::{Arc, Mutex},
};

use anyhow::{Context, Result};
use clap::Parser;
use tokio::{
    net::UnixListener,
    signal::unix::{signal, SignalKind},
    sync::watch,
};
use tracing::{info, info_span, warn, Level};
use tracing_subscriber::{filter::Targets, layer::SubscriberExt, util::SubscriberInitExt};
use xagg_api::{Request, Response};
use xagg_common::slot::MAX_SLOTS;
use xagg_daemon::{
    api::Handler,
    config::{Config, DaemonSection},
    connections::BoundedListener,
    dataplane::{self, Dataplane},
    job::from_job,
    join::Joins,
    owner::Owner,
    preflight::{self, Checking, Severity},
};
use xagg_join::{
    JoinReply, JoinRequest, MemberReply, MemberRequest, NonceReply, RingReply, RingRequest,
};

/// The in-network aggregation switch daemon.
///
/// Attaches the XDP switch program to the ports named in the configuration, and serves
/// the local API (a Unix socket) through which `xagg` adds, removes and lists jobs and
/// reads counters. By default the dataplane is pinned in a bpffs and keeps aggregating
/// after the daemon stops; a restarted daemon adopts it. SIGINT and SIGTERM stop the
/// daemon cleanly.
#[derive(Parser)]
#[command(version)]
struct Args {
    /// Configuration file (TOML; see docs/daemon.md).
    #[arg(short, long)]
    config: PathBuf,
    /// Replace a pinned dataplane instead of adopting it (running jobs are dropped).
    #[arg(long)]
    reload: bool,
    /// Check the configuration as a start would (ports, addresses, files and their
    /// modes, the pin path, listeners, credentials, other daemons) and attach nothing.
    #[arg(long)]
    check: bool,
}

struct State {
    dp: Dataplane,
    cfg: Config,
    /// Jobs workers joined over the network.
    joins: Joins,
    /// When each drop reason's first sender was last logged.
    drops_logged: std::collections::HashMap<u32, std::time::Instant>,
}

/// Serves the API's routes from the daemon's state.
#[derive(Clone)]
struct Daemon {
    state: Arc<Mutex<State>>,
    detach: watch::Sender<bool>,
}

impl Daemon {
    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl Handler for Daemon {
    fn admin(&self, req: Request) -> Response {
        match req {
            Request::Detach => {
                let _ = self.detach.send(true);
                Response::Ok
            }
            req => handle(&mut self.state(), req),
        }
    }

    fn nonce(&self) -> NonceReply {
        let st = &mut *self.state();
        let segment = st.dp.segment_bytes();
        st.joins.nonce(segment)
    }

    fn join(&self, req: JoinRequest) -> JoinReply {
        let _span = info_span!("join", key = %req.key, rank = req.rank).entered();
        let st = &mut *self.state();
        st.joins.join(&mut st.dp, &req)
    }

    fn member(&self, action: &'static str, req: MemberRequest) -> MemberReply {
        let _span = info_span!("member", key = %req.key, rank = req.rank, action).entered();
        let st = &mut *self.state();
        st.joins.member(&mut st.dp, action, &req)
    }

    fn ring(&self, req: RingRequest) -> RingReply {
        let _span = info_span!("ring", key = %req.key, first = req.host.first).entered();
        self.state().joins.ring(&req)
    }
}

/// What `RUST_LOG` asks for (`info` when unset): a default level and levels per target,
/// `warn,xagg_daemon::join=debug`. Targets rather than `EnvFilter`, whose span and field
/// matching nobody here uses and whose regular expressions double the daemon's build.
fn log_filter() -> (Targets, Option<String>) {
    let info = Targets::new().with_default(Level::INFO);
    match std::env::var("RUST_LOG") {
        Err(_) => (info, None),
        Ok(text) => match text.parse() {
            Ok(filter) => (filter, None),
            Err(e) => (
                info,
                Some(format!("RUST_LOG={text:?} ignored ({e}): write levels as `info` or `warn,xagg_daemon::join=debug`; logging at info")),
            ),
        },
    }
}

/// The exit status of a configuration that does not load (EX_CONFIG): the unit does not
/// restart a daemon that would only fail the same way again.
const EX_CONFIG: u8 = 78;

fn main() -> std::process::ExitCode {
    let mut config_error = false;
    match run(&mut config_error) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("Error: {e:?}");
            std::process::ExitCode::from(if config_error { EX_CONFIG } else { 1 })
        }
    }
}

fn run(config_error: &mut bool) -> Result<()> {
    // `log` records of the library (dataplane, joins) go through the same subscriber.
    let (filter, bad) = log_filter();
    tracing_subscriber::fmt()
        .with_ansi(false)
        .with_writer(std::io::stderr)
        .finish()
        .with(filter)
        .init();
    if let Some(bad) = bad {
        warn!("{bad}");
    }
    let args = Args::parse();
    let cfg = Config::load(&args.config).inspect_err(|_| *config_error = true)?;
    if args.check {
        return check_only(&args, &cfg);
    }
    // One daemon per API socket, state directory and pinned dataplane.
    let mut owner = Owner::claim(&cfg)?;
    // Only this thread's network namespace changes, before the runtime starts its threads
    // (they inherit it). The mount namespace stays the host's, so pins outlive us.
    if let Some(ns) = &cfg.switch.netns {
        xagg_linux::iface::enter_netns(ns).with_context(|| {
            format!("switch.netns = \"{ns}\": the ports' network namespace (`ip netns list`)")
        })?;
        info!("entered network namespace {ns}");
    }
    let pinned = !cfg.daemon.detach_on_exit;
    if pinned && private_mounts() {
        warn!(
            "xaggd runs in a mount namespace of its own (as under `ip netns exec`): the pins it makes vanish with it, and the dataplane with them. Run it in the host's mount namespace with switch.netns naming the ports' namespace, or set daemon.detach_on_exit = true"
        );
    }
    // All or nothing: what can be checked is checked before anything is attached.
    let report = preflight::check(
        &cfg,
        Checking {
            reload: args.reload,
            only: false,
        },
    );
    for w in report.of(Severity::Warning) {
        warn!("{}", w.text);
    }
    if report.failed() {
        let errors: Vec<String> = report.of(Severity::Error).map(|f| f.text.clone()).collect();
        anyhow::bail!(
            "{}: {}\nnothing was attached (`xaggd --check --config {}` lists every finding)",
            args.config.display(),
            errors.join("\n"),
            args.config.display()
        );
    }
    if pinned
        && xagg_linux::pins::ensure_bpffs(&cfg.daemon.pin_path)
            .context("or set daemon.detach_on_exit = true")?
    {
        info!("mounted a bpffs at /sys/fs/bpf");
    }
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()?;
    // The sockets are bound before anything is attached, or removed: an address in use
    // fails here, with a `--reload`'s old dataplane and its jobs still running.
    let listeners = rt
        .block_on(Listeners::bind(&cfg.daemon))
        .context(if args.reload {
            "nothing was attached, and the running dataplane was kept"
        } else {
            "nothing was attached"
        })?;
    let removed = args.reload
        && dataplane::unpin(&cfg.daemon.pin_path).inspect_err(|_| {
            let _ = std::fs::remove_file(&cfg.daemon.socket);
        })?;
    if removed {
        info!(
            "removed the pinned dataplane at {}",
            cfg.daemon.pin_path.display()
        );
    }
    let dp = match Dataplane::start(&cfg, xagg_objects::SWITCH, pinned) {
        Ok(dp) => dp,
        Err(e) => {
            let _ = std::fs::remove_file(&cfg.daemon.socket);
            return Err(e.into());
        }
    };
    let how = if dp.adopted { "running" } else { "attached" };
    for (port, mode) in cfg.switch.ports.iter().zip(dp.xdp_in_use()) {
        info!("port {port}: XDP {how} in {mode} mode");
    }
    let state = match set_up(&cfg, dp) {
        Ok(state) => Arc::new(Mutex::new(state)),
        Err(e) => {
            let _ = std::fs::remove_file(&cfg.daemon.socket);
            return Err(e);
        }
    };
    host_ends(&cfg);
    owner.started();
    let detach = rt.block_on(serve(state.clone(), &cfg.daemon, listeners))?;
    state
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .joins
        .flush();
    let _ = std::fs::remove_file(&cfg.daemon.socket);
    let state = Arc::try_unwrap(state)
        .ok()
        .map(|m| m.into_inner().unwrap_or_else(|e| e.into_inner()));
    drop(state);
    if detach {
        dataplane::unpin(&cfg.daemon.pin_path)?;
        info!("dataplane detached and unpinned");
    } else if pinned {
        info!(
            "dataplane left running, pinned at {}",
            cfg.daemon.pin_path.display()
        );
    } else {
        info!("dataplane detached (detach_on_exit)");
    }
    Ok(())
}

/// Gives the ranks' ends of `[[host_end]]` their `xagg_host`, as `xagg host attach` does
/// (pinned: it outlives the daemon). One that cannot be attached (its namespace not made
/// yet, say) is said, and the daemon serves on: its rank waits for it.
fn host_ends(cfg: &Config) {
    use xagg_worker::host_end::{attach_in, Outcome};
    for h in &cfg.host_ends {
        let file = std::path::Path::new("/run/netns").join(&h.netns);
        let name = format!("network namespace {}", h.netns);
        match attach_in(xagg_objects::HOST, &file, &name, &h.iface) {
            Ok((Outcome::Attached(m), pin)) => info!(
                "host end {} in {name}: xagg_host attached ({} XDP), pinned at {}",
                h.iface,
                m.name(),
                pin.display()
            ),
            Ok((Outcome::Already(m), _)) => info!(
                "host end {} in {name}: xagg_host there already ({} XDP)",
                h.iface,
                m.name()
            ),
            Err(e) => warn!(
                "host end {} in {name}: {e}: its rank gets no results until it is attached (`xagg host attach {} --netns {}`)",
                h.iface, h.iface, h.netns
            ),
        }
    }
}

/// `xaggd --check`: every finding a start would make, attaching and claiming nothing;
/// fails when a start would.
fn check_only(args: &Args, cfg: &Config) -> Result<()> {
    if let Some(ns) = &cfg.switch.netns {
        xagg_linux::iface::enter_netns(ns).with_context(|| {
            format!("switch.netns = \"{ns}\": the ports' network namespace (`ip netns list`)")
        })?;
    }
    let report = preflight::check(
        cfg,
        Checking {
            reload: args.reload,
            only: true,
        },
    );
    println!("checking {}", args.config.display());
    for f in &report.findings {
        println!("{f}");
    }
    let warnings = report.of(Severity::Warning).count();
    let errors = report.of(Severity::Error).count();
    if errors > 0 {
        anyhow::bail!(
            "{}: errors {errors}, warnings {warnings}: a start would fail (nothing was attached)",
            args.config.display()
        );
    }
    if xagg_daemon::owner::holders(cfg).is_empty() {
        println!(
            "{}: no errors, warnings {warnings}: `xaggd --config {}` would start (nothing was attached; the kernel's verifier sees the programs only then)",
            args.config.display(),
            args.config.display()
        );
    } else {
        println!(
            "{}: no errors, warnings {warnings}: the configuration is sound, and a daemon runs with it: `xaggd --config {}` would be refused until that one stops (nothing was attached)",
            args.config.display(),
            args.config.display()
        );
    }
    Ok(())
}

/// Everything after the dataplane is up: the configuration's jobs and the joins' state.
/// A failure undoes what this start did: a fresh dataplane is detached and unpinned, the
/// jobs added to an adopted one are removed, and the adopted one is left as it was.
fn set_up(cfg: &Config, mut dp: Dataplane) -> Result<State> {
    let mut added = Vec::new();
    let r = (|| -> Result<Joins> {
        let existing: Vec<u32> = dp.jobs()?.into_iter().map(|(id, _)| id).collect();
        for job in &cfg.jobs {
            if existing.contains(&job.id) {
                continue;
            }
            let job = dp
                .add_job(job)
                .with_context(|| format!("[[job]] id {} in the configuration", job.id))?;
            added.push(job.id);
            info!(
                "job {} added from the configuration (slots {}..{})",
                job.id,
                job.slot_base.unwrap_or(0),
                job.slot_base.unwrap_or(0) + job.slots
            );
        }
        let switch = std::net::SocketAddrV4::new(cfg.switch.address, cfg.switch.udp_port);
        let mac = dp.switch_config()?.mac;
        Ok(Joins::new(cfg, switch, &dp)?.with_mac(mac))
    })();
    match r {
        Ok(joins) => Ok(State {
            dp,
            cfg: cfg.clone(),
            joins,
            drops_logged: Default::default(),
        }),
        Err(e) if dp.adopted => {
            for id in added {
                let _ = dp.remove_job(id);
            }
            Err(e.context("the adopted dataplane is left as it was"))
        }
        Err(e) => {
            drop(dp);
            if !cfg.daemon.detach_on_exit {
                let _ = dataplane::unpin(&cfg.daemon.pin_path);
            }
            Err(e.context("the dataplane this start attached is detached again"))
        }
    }
}

/// The daemon's sockets, bound before anything is attached.
struct Listeners {
    api: UnixListener,
    network: Option<tokio::net::TcpListener>,
    metrics: Option<tokio::net::TcpListener>,
}

impl Listeners {
    async fn bind(daemon: &DaemonSection) -> Result<Self> {
        let tcp = |key: &'static str, addr: Option<std::net::SocketAddr>| async move {
            match addr {
                None => Ok(None),
                Some(addr) => tokio::net::TcpListener::bind(addr)
                    .await
                    .map(Some)
                    .map_err(|error| xagg_daemon::Error::Bind { key, addr, error }),
            }
        };
        let network = tcp("daemon.listen", daemon.listen).await?;
        let metrics = tcp("daemon.metrics", daemon.metrics).await?;
        let api = bind_api(daemon)?;
        Ok(Self {
            api,
            network,
            metrics,
        })
    }
}

/// Whether this process's mount namespace differs from its parent's (or, where that
/// cannot be read, init's): pins made in it vanish when it ends (`ip netns exec` gives its
/// command a private one, with /sys mounted again).
fn private_mounts() -> bool {
    let parent = format!("/proc/{}/ns/mnt", nix::unistd::getppid());
    let theirs = std::fs::read_link(&parent).or_else(|_| std::fs::read_link("/proc/1/ns/mnt"));
    match (std::fs::read_link("/proc/self/ns/mnt"), theirs) {
        (Ok(mine), Ok(init)) => mine != init,
        _ => false,
    }
}

/// Binds the API socket and gives it `daemon.socket_group` and `daemon.socket_mode`. It is
/// created accessible to its owner only (umask 0177), so no one else can connect before
/// its group and mode are set.
fn bind_api(daemon: &DaemonSection) -> Result<UnixListener> {
    use nix::sys::stat::{umask, Mode};
    use std::os::unix::fs::PermissionsExt;
    let socket = &daemon.socket;
    // Checked when the configuration was read; the group is looked up again here.
    let mode = daemon.socket_mode()?;
    let gid = daemon.socket_gid()?;
    if let Some(dir) = socket.parent() {
        // 0755: readable by all (the socket's own mode decides who may connect),
        // writable only by the daemon (nobody else can put a socket in its place).
        // Made already by the socket's lock (`Owner::claim`), which removes it again.
        xagg_daemon::owner::create_dir(dir, 0o755)
            .with_context(|| format!("creating {}", dir.display()))?;
    }
    let _ = std::fs::remove_file(socket);
    let old = umask(Mode::from_bits_truncate(0o177));
    let bound = UnixListener::bind(socket);
    umask(old);
    let listener = bound.with_context(|| format!("binding the API socket {}", socket.display()))?;
    let gid = gid.unwrap_or_else(nix::unistd::getegid);
    nix::unistd::chown(socket, None, Some(gid)).with_context(|| {
        format!(
            "giving the API socket {} the group {} (daemon.socket_group; the daemon needs CAP_CHOWN for a group it is not in)",
            socket.display(),
            daemon.socket_group.as_deref().unwrap_or("of the daemon")
        )
    })?;
    std::fs::set_permissions(socket, std::fs::Permissions::from_mode(mode)).with_context(|| {
        format!(
            "setting the mode of the API socket {} to {:04o} (daemon.socket_mode)",
            socket.display(),
            mode
        )
    })?;
    if mode & 0o002 != 0 {
        warn!(
            "daemon.socket_mode = \"{}\": every local user may add and remove jobs and detach the switch; \"0660\" with daemon.socket_group limits that to a group",
            daemon.socket_mode
        );
    }
    info!(
        "API on {} (mode {:04o}, group {})",
        socket.display(),
        mode,
        nix::unistd::Group::from_gid(gid)
            .ok()
            .flatten()
            .map(|g| g.name)
            .unwrap_or_else(|| gid.to_string())
    );
    Ok(listener)
}

/// Serves the API until a signal or a detach request; returns whether to detach.
async fn serve(
    state: Arc<Mutex<State>>,
    daemon: &DaemonSection,
    listeners: Listeners,
) -> Result<bool> {
    let Listeners {
        api: listener,
        network,
        metrics,
    } = listeners;
    let mut sigint = signal(SignalKind::interrupt())?;
    let mut sigterm = signal(SignalKind::terminate())?;
    // A HUP would end the daemon unhandled: said, and nothing else.
    let mut sighup = signal(SignalKind::hangup())?;
    let (detach_tx, mut detach_rx) = watch::channel(false);
    let handler = Daemon {
        state: state.clone(),
        detach: detach_tx,
    };
    // Timers of the joined jobs: join timeouts, idle jobs.
    let ticking = handler.clone();
    tokio::spawn(async move {
        let mut every = tokio::time::interval(std::time::Duration::from_secs(1));
        loop {
            every.tick().await;
            let st = &mut *ticking.state();
            st.joins.tick(&mut st.dp);
            st.dp.sweep_hellos();
            log_drops(st);
        }
    });
    let (stop_tx, stop_rx) = watch::channel(false);
    if let (Some(addr), Some(tcp)) = (daemon.listen, network) {
        info!("network listener (the join protocol only) on {addr}");
        let app = xagg_daemon::api::network_router(handler.clone());
        let mut stop = stop_rx.clone();
        tokio::spawn(async move {
            let tcp = BoundedListener::new(tcp, "network listener");
            let r = axum::serve(xagg_daemon::head::Limited(tcp), app)
                .with_graceful_shutdown(async move {
                    let _ = stop.wait_for(|s| *s).await;
                })
                .await;
            if let Err(e) = r {
                warn!("network listener: {e}");
            }
        });
    }
    if let (Some(addr), Some(tcp)) = (daemon.metrics, metrics) {
        info!("Prometheus metrics on http://{addr}/metrics");
        let scraped = handler.clone();
        let app = axum::Router::new().route(
            "/metrics",
            axum::routing::get(move || {
                let h = scraped.clone();
                async move {
                    match xagg_daemon::metrics::render(&h.state().dp) {
                        Ok(text) => (
                            axum::http::StatusCode::OK,
                            [("content-type", xagg_daemon::metrics::CONTENT_TYPE)],
                            text,
                        ),
                        Err(e) => (
                            axum::http::StatusCode::INTERNAL_SERVER_ERROR,
                            [("content-type", xagg_daemon::metrics::CONTENT_TYPE)],
                            format!("# {e}\n"),
                        ),
                    }
                }
            }),
        );
        let mut stop = stop_rx.clone();
        tokio::spawn(async move {
            let r = axum::serve(BoundedListener::new(tcp, "metrics endpoint"), app)
                .with_graceful_shutdown(async move {
                    let _ = stop.wait_for(|s| *s).await;
                })
                .await;
            if let Err(e) = r {
                warn!("metrics endpoint: {e}");
            }
        });
    }
    let app = xagg_daemon::api::router(handler);
    let (why_tx, why_rx) = tokio::sync::oneshot::channel::<bool>();
    let stop = async move {
        let detach = loop {
            tokio::select! {
                _ = sighup.recv() => warn!(
                    "SIGHUP: xaggd does not reload its configuration; restart it to apply a changed one (`systemctl restart xaggd`: the pinned dataplane, its jobs and the joined jobs are kept across the restart)"
                ),
                _ = sigint.recv() => { info!("SIGINT: stopping"); break false }
                _ = sigterm.recv() => { info!("SIGTERM: stopping"); break false }
                _ = detach_rx.changed() => break true,
            }
        };
        let _ = sd_notify::notify(&[sd_notify::NotifyState::Stopping]);
        let _ = stop_tx.send(true);
        let _ = why_tx.send(detach);
    };
    // Ready for systemd (Type=notify) once the dataplane is attached and the API answers.
    if let Err(e) = sd_notify::notify(&[sd_notify::NotifyState::Ready]) {
        warn!("telling the service manager the daemon is ready (NOTIFY_SOCKET): {e}");
    }
    axum::serve(xagg_daemon::head::Limited(listener), app)
        .with_graceful_shutdown(stop)
        .await
        .context("serving the API")?;
    Ok(why_rx.await.unwrap_or(false))
}

/// How often each drop reason's first sender is logged at most.
const DROP_LOG_EVERY: std::time::Duration = std::time::Duration::from_secs(60);

/// Logs the first sender of each drop reason the switch saw, once a minute per reason at
/// most (the switch keeps the first one until it is taken).
fn log_drops(st: &mut State) {
    let now = std::time::Instant::now();
    for c in st.dp.drop_reasons() {
        let due = st
            .drops_logged
            .get(&(c as u32))
            .is_none_or(|t| now.duration_since(*t) >= DROP_LOG_EVERY);
        if !due {
            continue;
        }
        let Some(a) = st.dp.take_drop_source(c) else {
            continue;
        };
        st.drops_logged.insert(c as u32, now);
        let port = st
            .dp
            .port_named(a.ifindex)
            .unwrap_or_else(|| format!("ifindex {}", a.ifindex));
        let from = std::net::SocketAddrV4::new(a.ip.into(), u16::from_be_bytes(a.port));
        let mac = xagg_linux::iface::fmt_mac(&a.mac);
        if matches!(
            c,
            xagg_common::Counter::DropDuplicate | xagg_common::Counter::DropStale
        ) {
            // What every retransmission that crossed its answer looks like: no fault.
            info!(
                reason = c.name(),
                port,
                %mac,
                %from,
                "a member resent a contribution the switch already had (a retransmission; the first since the last report, `xagg counters` has the totals)"
            );
        } else {
            warn!(
                reason = c.name(),
                port,
                %mac,
                %from,
                "dropped a packet (the first of this reason since the last report; `xagg counters` has the totals)"
            );
        }
    }
}

fn handle(st: &mut State, req: Request) -> Response {
    // Requests about one job run in its span, so its log lines carry its id.
    let job = match &req {
        Request::AddJob { job } => Some(job.id),
        Request::RemoveJob { id } | Request::JobStatus { id } | Request::JobCounters { id } => {
            Some(*id)
        }
        _ => None,
    };
    let _span = job.map(|id| info_span!("job", id).entered());
    let r = match req {
        Request::AddJob { job } => st.dp.add_job(&job).map(|job| {
            info!(
                "job {} added: {} members, slots {}..{}",
                job.id,
                job.members.len(),
                job.slot_base.unwrap_or(0),
                job.slot_base.unwrap_or(0) + job.slots
            );
            Response::Job { job }
        }),
        Request::RemoveJob { id } => st.dp.remove_job(id).map(|()| {
            info!("job {id} removed");
            Response::Ok
        }),
        Request::ListJobs => st.dp.jobs().map(|jobs| Response::Jobs {
            jobs: jobs
                .iter()
                .map(|(id, j)| from_job(*id, j))
                .collect(),
        }),
        Request::Counters => st
            .dp
            .counters()
            .map(|counters| Response::Counters { counters }),
        Request::Status => st.dp.jobs().and_then(|jobs| {
            let sw = st.dp.switch_config()?;
            Ok(Response::Status {
                ports: st.cfg.switch.ports.clone(),
                pinned: st.dp.pinned(),
                adopted: st.dp.adopted,
                jobs: jobs.len(),
                slots_total: MAX_SLOTS,
                slots_used: jobs.iter().map(|(_, j)| j.slot_count).sum(),
                address: std::net::Ipv4Addr::from(sw.ip).to_string(),
                udp_port: u16::from_be_bytes(sw.port),
                mac: xagg_linux::iface::fmt_mac(&sw.mac),
                xdp_mode: st.cfg.switch.xdp_mode.clone(),
                xdp_in_use: st.dp.xdp_in_use(),
                pin_path: st.dp.pinned().then(|| st.cfg.daemon.pin_path.clone()),
                steer_cpus: st.dp.steer.clone(),
                faults: st
                    .dp
                    .faults()
                    .ok()
                    .filter(|&(c, r)| c > 0.0 || r > 0.0)
                    .map(|(c, r)| xagg_api::Faults {
                        drop_contribution: c,
                        drop_result: r,
                    }),
                parent: st.cfg.parent.as_ref().map(|p| xagg_api::ParentStatus {
                    interface: p.interface.clone(),
                    daemon: p.daemon,
                    credential: p.credential.clone(),
                }),
                listen: st.cfg.daemon.listen,
                metrics: st.cfg.daemon.metrics,
            })
        }),
        Request::JobStatus { id } => st.dp.job_status(id).map(|slots| Response::JobStatus { slots }),
        Request::Inject { drop_contribution, drop_result } => {
            st.dp.set_faults(drop_contribution, drop_result).map(|()| {
                info!("fault injection: drop {drop_contribution} of contributions, {drop_result} of result copies");
                Response::Ok
            })
        }
        Request::Detach => Ok(Response::Ok),
        Request::JobCounters { id } => st
            .dp
            .job_counters(id)
            .map(|job| Response::JobCounters { job }),
        Request::Joins => Ok(Response::Joins {
            joins: st.joins.listing(),
        }),
    };
    r.unwrap_or_else(|e| Response::Error {
        message: e.to_string(),
    })
}
