//! `cargo xtask bench --bundle DIR`: the bench as a directory that runs on another Linux
//! x86-64 machine (glibc 2.36 or later, root) with no Rust toolchain, no package registry,
//! no Open MPI and no iproute2.
//!
//! ```text
//! DIR/run               the bench: ./run [OPTIONS of cargo xtask bench]
//! DIR/bin/              xtask-run, xaggd, xagg, libxagg_mpi.so, mpi_allreduce (compiled
//!                       here with mpicc), and two wrappers found first on PATH:
//!                       ip (iproute2's, through the loader) and mpirun (Open MPI's, its
//!                       environment relocated)
//! DIR/objects/          the XDP objects the bench loads itself (the switch's, a worker's,
//!                       the test programs')
//! DIR/openmpi/          Debian's Open MPI and every library it links that a glibc
//!                       machine may lack, as `dpkg -x` lays them out
//! DIR/iproute2/         Debian's `ip` and its libraries, likewise
//! DIR/manifest.txt      the commit and the packages it was made of
//! ```
//!
//! The packages are the versions installed here (what `mpicc` compiled the MPI program
//! against), from the package archive through `apt-get download`, kept in
//! `target/bundle-debs/`. What they need is found from the ELF files themselves: every
//! library an extracted binary, library or plugin links (`readelf -d`) and the bundle does
//! not hold is looked up (`dpkg -S`) and its package added, until nothing is missing;
//! glibc's, zlib's, libgcc's and libstdc++'s libraries are taken from the machine.

use std::{
    collections::BTreeSet,
    fs,
    os::unix::fs::{symlink, PermissionsExt},
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{bail, Context, Result};
use xtask::build::{root, target_dir};

use super::frameworks::{compile_mpi_program, MPI_PROGRAM};

/// Open MPI as Debian installs it (the runtime; no compiler wrappers are needed there).
const OPENMPI: &[&str] = &["openmpi-bin", "openmpi-common", "libopenmpi3"];
/// Packages whose libraries every glibc x86-64 machine has: glibc itself (libc, libm, the
/// loader...), zlib, libgcc_s and libstdc++. A newer glibc runs what was linked against an
/// older one; a bundled older copy on the library path would shadow the machine's.
const BASE: &[&str] = &["libc6", "zlib1g", "libgcc-s1", "libstdc++6", "gcc-12-base"];
/// The x86-64 ABI's dynamic loader, where every glibc x86-64 machine has it.
const LOADER: &str = "/lib64/ld-linux-x86-64.so.2";
/// Names the manifest starts with: a directory holding it is a bundle, which `--bundle`
/// replaces; any other non-empty directory it refuses.
const MARK: &str = "xagg bench bundle";

/// Writes the bundle into `dir` (replacing an earlier bundle there).
pub fn write(dir: &Path) -> Result<()> {
    prepare(dir)?;
    let release = target_dir().join("release");
    let bin = dir.join("bin");
    fs::create_dir_all(&bin)?;
    for name in ["xtask-run", "xaggd", "xagg", "libxagg_mpi.so"] {
        copy(&release.join(name), &bin.join(name))
            .with_context(|| format!("{name} (`cargo xtask bench --bundle` builds it)"))?;
    }
    let objects = dir.join("objects");
    fs::create_dir_all(&objects)?;
    for o in [
        xagg_lab::Object::Switch,
        xagg_lab::Object::Host,
        xagg_lab::Object::Test,
    ] {
        let from = o.path();
        copy(
            &from,
            &objects.join(from.file_name().context("an object's name")?),
        )?;
    }
    compile_mpi_program(&bin.join(MPI_PROGRAM))?;

    let cache = target_dir().join("bundle-debs");
    fs::create_dir_all(&cache)?;
    let mut manifest = vec![MARK.to_string(), format!("commit {}", commit())];

    let mut openmpi = Tree::new(dir.join("openmpi"), &cache);
    for p in OPENMPI {
        openmpi.add(p)?;
    }
    openmpi.complete()?;
    manifest.push(format!("openmpi: {}", openmpi.debs.join(" ")));

    // iproute2's `ip` alone (the lab runs nothing else of it), with what it links.
    let staging = cache.join("iproute2-staging");
    let _ = fs::remove_dir_all(&staging);
    let mut iproute2 = Tree::new(staging.clone(), &cache);
    iproute2.add("iproute2")?;
    let ip = ["bin/ip", "sbin/ip", "usr/bin/ip", "usr/sbin/ip"]
        .iter()
        .map(|p| staging.join(p))
        .find(|p| p.is_file())
        .context("no `ip` in Debian's iproute2 package")?;
    iproute2.dir = dir.join("iproute2");
    fs::create_dir_all(iproute2.dir.join("bin"))?;
    copy(&ip, &iproute2.dir.join("bin/ip"))?;
    fs::remove_dir_all(&staging)?;
    iproute2.complete()?;
    manifest.push(format!("iproute2: {}", iproute2.debs.join(" ")));

    for (name, text) in [
        ("run", RUN),
        ("bin/ip", IP_WRAPPER),
        ("bin/mpirun", MPIRUN_WRAPPER),
    ] {
        let path = dir.join(name);
        fs::write(&path, text.replace("@LOADER@", LOADER))?;
        fs::set_permissions(&path, fs::Permissions::from_mode(0o755))?;
    }
    manifest.push(String::new());
    fs::write(dir.join("manifest.txt"), manifest.join("\n"))?;
    println!(
        "bundle written to {} ({} MB): copy it to the machine and run `{}/run --help` there",
        dir.display(),
        size(dir)? >> 20,
        dir.file_name().unwrap_or_default().to_string_lossy()
    );
    Ok(())
}

/// Empties `dir` if it is an earlier bundle, creates it if missing, and refuses any other
/// non-empty directory.
fn prepare(dir: &Path) -> Result<()> {
    if dir.exists() {
        let empty = fs::read_dir(dir)?.next().is_none();
        let bundle =
            fs::read_to_string(dir.join("manifest.txt")).is_ok_and(|m| m.starts_with(MARK));
        if !empty && !bundle {
            bail!(
                "{} is not empty and holds no bundle: give a new or empty directory",
                dir.display()
            );
        }
        fs::remove_dir_all(dir)?;
    }
    fs::create_dir_all(dir)?;
    // Marked at once, so that a bundle left unfinished is replaced as well.
    fs::write(dir.join("manifest.txt"), format!("{MARK} (unfinished)\n"))?;
    Ok(())
}

/// The commit the bundle is made from, `+` if the tree had changes.
fn commit() -> String {
    let git = |args: &[&str]| {
        Command::new("git")
            .args(args)
            .current_dir(root())
            .output()
            .ok()
            .filter(|o| o.status.success())
            .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
    };
    let head = git(&["rev-parse", "HEAD"]).unwrap_or_else(|| "unknown".into());
    let dirty = git(&["status", "--porcelain"]).is_some_and(|s| !s.is_empty());
    format!("{head}{}", if dirty { "+" } else { "" })
}

/// Packages extracted into one directory, as `dpkg -x` lays them out.
struct Tree<'a> {
    dir: PathBuf,
    /// Where the `.deb`s are kept.
    cache: &'a Path,
    packages: BTreeSet<String>,
    /// The `.deb`s extracted, by file name (package, version, architecture).
    debs: Vec<String>,
}

impl<'a> Tree<'a> {
    fn new(dir: PathBuf, cache: &'a Path) -> Self {
        Self {
            dir,
            cache,
            packages: BTreeSet::new(),
            debs: Vec::new(),
        }
    }

    /// Extracts `package` into the tree (without its documentation) unless it is there.
    fn add(&mut self, package: &str) -> Result<()> {
        if !self.packages.insert(package.to_string()) {
            return Ok(());
        }
        let deb = fetch(package, self.cache)?;
        fs::create_dir_all(&self.dir)?;
        xtask::build::run(Command::new("dpkg").arg("-x").arg(&deb).arg(&self.dir))?;
        for d in [
            "usr/share/doc",
            "usr/share/man",
            "usr/share/lintian",
            "usr/share/info",
        ] {
            let _ = fs::remove_dir_all(self.dir.join(d));
        }
        self.debs
            .push(deb.file_name().unwrap_or_default().to_string_lossy().into());
        Ok(())
    }

    /// Adds the package of every library an ELF file in the tree links and the tree does
    /// not hold, until none is missing; the [`BASE`] packages' libraries are the machine's.
    fn complete(&mut self) -> Result<()> {
        let mut from_machine = BTreeSet::new();
        let mut scanned = BTreeSet::new();
        let mut needed = BTreeSet::new();
        loop {
            let mut files = Vec::new();
            walk(&self.dir, &mut files)?;
            let held: BTreeSet<String> = files
                .iter()
                .filter_map(|p| p.file_name().map(|n| n.to_string_lossy().into_owned()))
                .collect();
            for f in files {
                if f.is_file() && !f.is_symlink() && is_elf(&f) && scanned.insert(f.clone()) {
                    needed.extend(needed_by(&f)?);
                }
            }
            let missing: Vec<&String> = needed
                .iter()
                .filter(|n| !held.contains(*n) && !from_machine.contains(*n))
                .collect();
            if missing.is_empty() {
                return Ok(());
            }
            let had = self.packages.clone();
            for soname in missing {
                let (package, link) = owner(soname)?;
                if BASE.contains(&package.as_str()) {
                    from_machine.insert(soname.clone());
                    continue;
                }
                self.add(&package)?;
                match link {
                    // The link, in the tree, to the file as the package holds it.
                    Some((link, target)) => {
                        let at = self.dir.join(link.strip_prefix("/")?);
                        fs::create_dir_all(at.parent().context("a link's directory")?)?;
                        let up = "../".repeat(link.components().count() - 2);
                        symlink(format!("{up}{}", target.strip_prefix("/")?.display()), &at)?;
                    }
                    None if had.contains(&package) => bail!(
                        "{package} is in the bundle but {soname} is not where it was looked for"
                    ),
                    None => {}
                }
            }
        }
    }
}

/// The `.deb` of `package` at the version installed here (what `mpicc` compiled against),
/// downloaded into `cache` unless already there; if the archive no longer has that
/// version, the one kept from an earlier bundle, else the archive's current one.
fn fetch(package: &str, cache: &Path) -> Result<PathBuf> {
    let version = installed_version(package)?;
    // apt-get download names the file package_version_arch.deb, the epoch's ':' as %3a.
    let exact = format!("{package}_{}_", version.replace(':', "%3a"));
    let any = format!("{package}_");
    let cached = |stem: &str| -> Result<Option<PathBuf>> {
        Ok(fs::read_dir(cache)?
            .filter_map(|e| e.ok().map(|e| e.path()))
            .find(|p| {
                p.file_name()
                    .and_then(|n| n.to_str())
                    .is_some_and(|n| n.starts_with(stem) && n.ends_with(".deb"))
            }))
    };
    if let Some(deb) = cached(&exact)? {
        return Ok(deb);
    }
    let download = |what: &str| {
        Command::new("apt-get")
            .args(["download", "-qq", "-o", "APT::Sandbox::User=root", what])
            .current_dir(cache)
            .output()
            .context("running apt-get")
    };
    eprintln!("bundle: downloading {package} {version} (apt-get download)");
    if download(&format!("{package}={version}"))?.status.success() {
        return cached(&exact)?.with_context(|| format!("apt-get downloaded no {exact}*.deb"));
    }
    if let Some(deb) = cached(&any)? {
        return Ok(deb);
    }
    eprintln!("bundle: {package} {version} is no longer in the archive: its current version");
    let o = download(package)?;
    anyhow::ensure!(
        o.status.success(),
        "apt-get download {package}: {} (the bundle needs the package archive once: check \
         the network and run `apt-get update`; the .debs are then kept in {})",
        String::from_utf8_lossy(&o.stderr).trim(),
        cache.display()
    );
    cached(&any)?.with_context(|| format!("apt-get downloaded no {any}*.deb"))
}

fn installed_version(package: &str) -> Result<String> {
    let o = Command::new("dpkg-query")
        .args(["-W", "-f", "${Version}\n", package])
        .output()
        .context("running dpkg-query")?;
    let text = String::from_utf8_lossy(&o.stdout);
    match text
        .lines()
        .next()
        .filter(|v| o.status.success() && !v.is_empty())
    {
        Some(v) => Ok(v.to_string()),
        None => bail!(
            "{package} is not installed here (`cargo xtask setup` installs Open MPI and iproute2)"
        ),
    }
}

/// Every file and symbolic link under `dir`.
fn walk(dir: &Path, out: &mut Vec<PathBuf>) -> Result<()> {
    for e in fs::read_dir(dir)? {
        let e = e?;
        let path = e.path();
        if e.file_type()?.is_dir() {
            walk(&path, out)?;
        } else {
            out.push(path);
        }
    }
    Ok(())
}

fn is_elf(path: &Path) -> bool {
    use std::io::Read;
    let mut magic = [0u8; 4];
    fs::File::open(path)
        .and_then(|mut f| f.read_exact(&mut magic))
        .is_ok_and(|_| magic == *b"\x7fELF")
}

/// The libraries `file` links (its `DT_NEEDED` entries).
fn needed_by(file: &Path) -> Result<Vec<String>> {
    let o = Command::new("readelf")
        .args(["-d", "-W"])
        .arg(file)
        .output()
        .context("running readelf (binutils)")?;
    Ok(String::from_utf8_lossy(&o.stdout)
        .lines()
        .filter(|l| l.contains("(NEEDED)"))
        .filter_map(|l| Some(l.split_once('[')?.1.split_once(']')?.0.to_string()))
        .collect())
}

/// The installed package holding the x86-64 library `soname`, and, where the library is
/// a link the package does not hold (an alternative, chosen at install time), that link
/// and the file it resolves to.
fn owner(soname: &str) -> Result<(String, Option<(PathBuf, PathBuf)>)> {
    if let Some(p) = dpkg_owner(soname) {
        return Ok((p, None));
    }
    let link = ["/usr/lib/x86_64-linux-gnu", "/lib/x86_64-linux-gnu"]
        .iter()
        .map(|d| Path::new(d).join(soname))
        .find(|p| p.exists())
        .with_context(|| format!("{soname}, which the bundle needs, is not installed here"))?;
    let target = fs::canonicalize(&link)?;
    let package = dpkg_owner(&target.display().to_string())
        .with_context(|| format!("no installed package holds {}", target.display()))?;
    Ok((package, Some((link, target))))
}

/// The package holding a file named like `pattern` (a library's name or a full path).
fn dpkg_owner(pattern: &str) -> Option<String> {
    let o = Command::new("dpkg").args(["-S", pattern]).output().ok()?;
    let name = Path::new(pattern).file_name()?;
    // Lines are `package[:arch][, package...]: path`.
    String::from_utf8_lossy(&o.stdout)
        .lines()
        .filter_map(|l| l.split_once(": "))
        .filter(|(_, path)| {
            Path::new(path).file_name() == Some(name)
                && (path.contains("x86_64-linux-gnu") || pattern.starts_with('/'))
        })
        .map(|(pkgs, _)| {
            let first = pkgs.split(", ").next().unwrap_or(pkgs);
            first.split(':').next().unwrap_or(first).to_string()
        })
        .next()
}

fn copy(from: &Path, to: &Path) -> Result<()> {
    fs::copy(from, to).with_context(|| format!("copying {}", from.display()))?;
    Ok(())
}

/// Bytes of the files under `dir`.
fn size(dir: &Path) -> Result<u64> {
    let mut files = Vec::new();
    walk(dir, &mut files)?;
    Ok(files
        .iter()
        .filter(|p| !p.is_symlink())
        .filter_map(|p| p.metadata().ok())
        .map(|m| m.len())
        .sum())
}

/// The bundle's entry point.
const RUN: &str = r#"#!/bin/sh
# The xagg bench (`cargo xtask bench`), self-contained, for Linux x86-64 (glibc 2.36 or
# later), as root: ./run [OPTIONS], the options those of `cargo xtask bench` (./run --help),
# e.g.
#   ./run --switch-cpus 0-3 --worker-cpus 4-15 --workers 2,4,8,12 --sizes 1MiB,16MiB,64MiB --rounds 3
# The switch's runs and Open MPI's MPI_Allreduce over TCP on the same netns lab (PyTorch's
# runs are left out: it is not bundled). The figures go to out/bench/ (bench.json,
# goodput.svg), or under the directory $XAGG_OUT names. The lab's namespaces are xagg-sw
# and xagg-w0, xagg-w1, ...: a run removes any left by an earlier one.
set -e
here=$(cd "$(dirname "$0")" && pwd)
# Nothing of this machine's Open MPI or PMIx settings reaches the bundle's (some machines
# set OMPI_MCA_plm=isolated, which puts every rank on mpirun's node).
for v in $(env | grep -Eo '^(OMPI|OPAL|PMIX|PRTE)_[A-Za-z0-9_]*=' | tr -d =); do
    unset "$v"
done
export PATH="$here/bin:$PATH"
export XAGG_BIN_DIR="$here/bin" XAGG_OBJECT_DIR="$here/objects"
# Where the bench writes (it writes under a workspace's target directory).
export CARGO_TARGET_DIR="${XAGG_OUT:-$here/out}"
export TMPDIR=/dev/shm
exec "$here/bin/xtask-run" bench --no-torch "$@"
"#;

/// `ip`, through the loader: its libraries come from the bundle for `ip` alone, and reach
/// no program it starts (`ip netns exec`), as `LD_LIBRARY_PATH` would.
const IP_WRAPPER: &str = r#"#!/bin/sh
# Debian's iproute2 `ip` with its libraries from ../iproute2, through the machine's loader.
d="${0%/*}/../iproute2"
exec @LOADER@ --library-path "$d/usr/lib/x86_64-linux-gnu:$d/lib/x86_64-linux-gnu" "$d/bin/ip" "$@"
"#;

/// `mpirun`: Debian's Open MPI relocated into the bundle, for mpirun and what it starts.
const MPIRUN_WRAPPER: &str = r#"#!/bin/sh
# Debian's Open MPI from ../openmpi: its installation directories (Open MPI's and PMIx's)
# moved there, its libraries first on the library path of mpirun and the processes it
# starts (its daemons and the ranks).
om=$(cd "${0%/*}/../openmpi" && pwd)
pmix="$om/usr/lib/x86_64-linux-gnu/pmix2"
export OPAL_PREFIX="$om/usr" OPAL_SYSCONFDIR="$om/etc/openmpi"
export PMIX_PREFIX="$pmix" PMIX_EXEC_PREFIX="$pmix" PMIX_BINDIR="$pmix/bin" \
    PMIX_SBINDIR="$pmix/sbin" PMIX_LIBEXECDIR="$pmix/libexec" PMIX_DATAROOTDIR="$pmix/share" \
    PMIX_DATADIR="$pmix/share" PMIX_SYSCONFDIR="$pmix/etc" PMIX_SHAREDSTATEDIR="$pmix/com" \
    PMIX_LOCALSTATEDIR="$pmix/var" PMIX_LIBDIR="$pmix/lib" PMIX_INCLUDEDIR="$pmix/include" \
    PMIX_INFODIR="$pmix/share/info" PMIX_MANDIR="$pmix/share/man" \
    PMIX_PKGDATADIR="$pmix/share/pmix" PMIX_PKGLIBDIR="$pmix/lib/pmix" \
    PMIX_PKGINCLUDEDIR="$pmix/include/pmix"
export PATH="$om/usr/bin:$PATH"
export LD_LIBRARY_PATH="$om/usr/lib/x86_64-linux-gnu:$om/lib/x86_64-linux-gnu:$om/usr/lib/x86_64-linux-gnu/openmpi/lib:$pmix/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
exec "$om/usr/bin/orterun" "$@"
"#;
