//! `devgate cdi generate`: CDI specs for the node's GPUs and RDMA devices.
//!
//! Without `-o` the specs go to stdout (one JSON document per kind; none is
//! refused). `-o DIR`
//! (an existing directory, e.g. `/etc/cdi`) writes one file per kind, named as
//! CDI's own tooling names them (`devgate.io-gpu.json`), and removes the file of
//! a kind that has no devices, since a spec without devices is invalid and a
//! stale one would name devices that are gone; a path that does not exist and
//! has no extension, or ends in `/`, is such a directory, created (a new
//! `devgate.yml` is refused: CDI loads only `*.json` and `*.yaml`). A host
//! root without sysfs is refused before anything is written or removed.
//! `-o FILE` gets one kind (a spec holds one); a second goes beside it. A
//! file that is a spec of a kind the run does not write (another vendor's,
//! or the other kind under `--kind`) is refused, with nothing written.
//! Either way, any other spec file in that directory that declares a kind
//! written or asked for is removed: CDI refuses a device two specs name.
use std::path::{Path, PathBuf};

use crate::cdi::{self, CdiError, Class};
use crate::config::{Config, ConfigError};
use crate::fsutil::{self, FsError};

#[derive(Debug, Clone, clap::Args)]
pub struct CdiArgs {
    #[command(subcommand)]
    pub cmd: CdiCmd,
}

#[derive(Debug, Clone, clap::Subcommand)]
pub enum CdiCmd {
    /// Write CDI specs (kinds devgate.io/gpu and devgate.io/rdma) for this node.
    Generate(GenerateArgs),
}

#[derive(Debug, Clone, clap::Args)]
pub struct GenerateArgs {
    /// Root holding the host's `sys/` and `proc/`.
    #[arg(long, default_value = "/")]
    pub host_root: PathBuf,
    /// Node config: device file mode and `rdma.allow_issm` shape the nodes.
    #[arg(long, default_value = crate::config::DEFAULT_CONFIG_PATH)]
    pub config: PathBuf,
    /// Only this kind.
    #[arg(long, value_enum)]
    pub kind: Option<Class>,
    /// `cdiVersion` to write: 0.6.0, or 0.5.0 for runtimes with an older CDI
    /// library (podman 4.3).
    #[arg(long, default_value = cdi::DEFAULT_CDI_VERSION)]
    pub cdi_version: String,
    /// A directory (one file per kind) or a file (one kind; a second goes
    /// beside it, `<stem>-<kind>.json`).
    #[arg(short = 'o', long = "output")]
    pub output: Option<PathBuf>,
}

#[derive(Debug, thiserror::Error)]
pub enum CdiCmdError {
    #[error(transparent)]
    Config(#[from] ConfigError),
    #[error(transparent)]
    Spec(#[from] CdiError),
    #[error("create cdi spec directory {path}")]
    Mkdir {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("no {kind} devices on this node: no spec to write to {path}")]
    Empty { kind: &'static str, path: PathBuf },
    #[error("encode cdi spec: {0}")]
    Encode(#[from] serde_json::Error),
    #[error("write cdi spec {path}")]
    Write {
        path: PathBuf,
        #[source]
        source: FsError,
    },
    #[error("remove stale cdi spec {path}")]
    Remove {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error(transparent)]
    Stdout(#[from] super::StdoutError),
    #[error(transparent)]
    NoSysfs(#[from] super::NoSysfs),
    #[error("no gpu or rdma devices on this node: no spec to print")]
    NothingToPrint,
    #[error("{path} is a cdi spec of kind {kind}, which this run does not write: name another file, or remove it first")]
    OtherKind { path: PathBuf, kind: String },
    #[error("{path} is a file not named *.json or *.yaml, which CDI never loads: name a spec file or a directory")]
    NotSpecNamed { path: PathBuf },
    #[error("{path} does not exist and is named like a file, but not *.json or *.yaml, which CDI never loads: name a spec file, or a directory (ending in / when its name has a dot)")]
    NewNotSpecNamed { path: PathBuf },
}

pub fn run(args: CdiArgs) -> Result<(), CdiCmdError> {
    match args.cmd {
        CdiCmd::Generate(a) => generate(a),
    }
}

fn generate(args: GenerateArgs) -> Result<(), CdiCmdError> {
    let config = Config::load(&args.config)?;
    // Before anything is removed as stale: such a root reads as a node
    // without devices, and every devgate spec in the directory would go.
    super::require_sysfs(&args.host_root)?;
    let inv = crate::gpu::discover_node(&args.host_root, &config.gpu);
    let classes: Vec<Class> = args.kind.map_or(Class::ALL.to_vec(), |k| vec![k]);
    let generated = cdi::generate(&inv, &config, &classes, &args.cdi_version)?;
    // stderr, one line each: stdout carries only the specs.
    for w in inv.warnings.iter().chain(&generated.warnings) {
        eprintln!("warning: {w}");
    }
    let Some(out) = args.output else {
        // Nothing printed with success would read as a spec, and an empty
        // one is invalid: refused, as `-o FILE` refuses it.
        if generated.specs.is_empty() {
            return Err(CdiCmdError::NothingToPrint);
        }
        let mut text = String::new();
        for (_, spec) in &generated.specs {
            text.push_str(&serde_json::to_string_pretty(spec)?);
            text.push('\n');
        }
        return Ok(super::to_stdout(&text)?);
    };
    let (dir, written) = match Output::of(&out)? {
        Output::Dir => (out.clone(), write_dir(&out, &classes, &generated.specs)?),
        Output::File => {
            let dir = match out.parent() {
                Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
                _ => PathBuf::from("."),
            };
            (dir, write_file(&out, &classes, &generated.specs)?)
        }
    };
    remove_other_specs(&dir, &classes, &written)
}

/// Removes the other spec files in `dir` that declare a kind of `classes`.
/// CDI refuses a device that two specs of one directory both name, so each
/// kind is kept in the files this run wrote alone: an earlier run may have
/// named the directory and this one a file, or the other way round, or
/// another file. Only `*.json`/`*.yaml` files (what CDI loads, links to
/// regular files included) are read; one that cannot be read or declares
/// another kind is left alone. A link is removed, not its target.
fn remove_other_specs(
    dir: &Path,
    classes: &[Class],
    written: &[(Class, PathBuf)],
) -> Result<(), CdiCmdError> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Ok(());
    };
    for path in entries.flatten().map(|e| e.path()) {
        if !cdi::spec_named(&path) {
            continue;
        }
        // Compared by name: every file written is in `dir`, however `-o`
        // spelled it (`devgate.json` against `./devgate.json`).
        let ours = written
            .iter()
            .any(|(_, w)| w.file_name() == path.file_name());
        if ours {
            continue;
        }
        let declared = kind_in(&path);
        let Some(class) = classes.iter().find(|c| declared == Some(c.kind())) else {
            continue;
        };
        remove_stale(&path, "another spec of its kind")?;
        let now = match written.iter().find(|(c, _)| c == class) {
            Some((_, holder)) => format!("{} now holds it", holder.display()),
            None => "this node has no such devices".to_string(),
        };
        eprintln!(
            "note: removed {}: it also declared {}; {now}",
            path.display(),
            class.kind()
        );
    }
    Ok(())
}

/// What `-o` names.
#[derive(Debug, PartialEq, Eq)]
enum Output {
    /// An existing directory, a path ending in `/`, or a path that does not
    /// exist and has no extension: one file per kind, created as needed.
    Dir,
    File,
}

impl Output {
    /// An existing file CDI would not load is refused: the spec would go
    /// where no runtime reads it, and the specs beside it that declare its
    /// kinds would then be removed as duplicates. So is a new path with an
    /// extension other than a spec's (CDI loads `*.json` and `*.yaml` only):
    /// made a directory, it would hide the specs where no runtime looks.
    fn of(path: &Path) -> Result<Output, CdiCmdError> {
        let spec_name = cdi::spec_named(path);
        if path.is_dir() || path.as_os_str().to_string_lossy().ends_with('/') {
            Ok(Output::Dir)
        } else if spec_name {
            Ok(Output::File)
        } else if path.exists() {
            Err(CdiCmdError::NotSpecNamed {
                path: path.to_path_buf(),
            })
        } else if path.extension().is_some() {
            // `devgate.yml`, `devgate.jsn`: meant as a spec file, which CDI
            // would never load, not as a directory to make.
            Err(CdiCmdError::NewNotSpecNamed {
                path: path.to_path_buf(),
            })
        } else {
            Ok(Output::Dir)
        }
    }
}

/// Writes one file per kind into `dir`: each kind written and its file.
fn write_dir(
    dir: &Path,
    classes: &[Class],
    specs: &[(Class, cdi::Spec)],
) -> Result<Vec<(Class, PathBuf)>, CdiCmdError> {
    std::fs::create_dir_all(dir).map_err(|source| CdiCmdError::Mkdir {
        path: dir.to_path_buf(),
        source,
    })?;
    let mut written = Vec::new();
    for class in classes {
        let path = dir.join(class.file_name());
        match specs.iter().find(|(c, _)| c == class) {
            Some((_, spec)) => {
                write_spec(&path, spec)?;
                written.push((*class, path));
            }
            None => remove_stale(&path, "a kind without devices")?,
        }
    }
    Ok(written)
}

/// The first kind with devices goes to `file`; a further kind to a file
/// beside it named after it (`devgate.json`, `devgate-rdma.json`), so a
/// runtime reading that directory resolves both kinds. A file beside it that
/// an earlier run wrote and this one does not is removed: it would name
/// devices that are gone, or the same ones twice.
fn write_file(
    file: &Path,
    classes: &[Class],
    specs: &[(Class, cdi::Spec)],
) -> Result<Vec<(Class, PathBuf)>, CdiCmdError> {
    let Some(((first_class, first), rest)) = specs.split_first() else {
        let kind = match classes {
            [one] => one.name(),
            _ => "gpu or rdma",
        };
        return Err(CdiCmdError::Empty {
            kind,
            path: file.to_path_buf(),
        });
    };
    // Nothing is written when one of the files would replace a spec of
    // another kind (another vendor's, or devgate's other one under `--kind`).
    check_replaceable(file, classes)?;
    for (class, _) in rest {
        check_replaceable(&beside(file, *class), classes)?;
    }
    // `/etc/cdi` exists only once something made it (neither bookworm's
    // podman nor containerd does), and `-o /etc/cdi/devgate.json` is how
    // the README names the spec.
    if let Some(dir) = file.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).map_err(|source| CdiCmdError::Mkdir {
            path: dir.to_path_buf(),
            source,
        })?;
    }
    write_spec(file, first)?;
    let mut written = vec![(*first_class, file.to_path_buf())];
    for (class, spec) in rest {
        let path = beside(file, *class);
        write_spec(&path, spec)?;
        written.push((*class, path.clone()));
        eprintln!(
            "note: {} holds one kind; {} went to {}",
            file.display(),
            class.kind(),
            path.display()
        );
    }
    for class in classes {
        let stale = beside(file, *class);
        // Only a spec of a kind of devgate's: never another file that
        // happens to bear the name.
        if declares_one_of(&stale, classes)
            && (class == first_class || !rest.iter().any(|(c, _)| c == class))
        {
            remove_stale(&stale, "a kind this file now holds or without devices")?;
        }
    }
    Ok(written)
}

/// Refuses to replace `path` when it is a spec of a kind not among
/// `classes`, the kinds this run writes or finds without devices: that
/// spec's devices would be gone from the runtime without a word. A file that
/// is no spec is the operator's to name.
fn check_replaceable(path: &Path, classes: &[Class]) -> Result<(), CdiCmdError> {
    match kind_in(path) {
        Some(kind) if !classes.iter().any(|c| c.kind() == kind) => Err(CdiCmdError::OtherKind {
            path: path.to_path_buf(),
            kind,
        }),
        _ => Ok(()),
    }
}

/// Whether `path` is a spec declaring one of `classes`' kinds.
fn declares_one_of(path: &Path, classes: &[Class]) -> bool {
    kind_in(path).is_some_and(|k| classes.iter().any(|c| c.kind() == k))
}

/// The kind the spec at `path` declares. A link counts as the file it
/// points at, as CDI reads it (`ReadSpec` reads the path, links followed);
/// only a regular file of bounded size is read, opened without blocking so
/// that a FIFO so named cannot hold the command.
fn kind_in(path: &Path) -> Option<String> {
    use std::io::Read;
    use std::os::unix::fs::OpenOptionsExt;
    // Never opened unless a regular file: a link to a device node (opening
    // some has effects of its own) is not followed into it.
    if !std::fs::metadata(path).is_ok_and(|m| m.is_file()) {
        return None;
    }
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK | libc::O_CLOEXEC)
        .open(path)
        .ok()?;
    let meta = file.metadata().ok()?;
    if !meta.is_file() || meta.len() > cdi::MAX_SPEC_BYTES {
        return None;
    }
    let mut bytes = Vec::new();
    file.take(cdi::MAX_SPEC_BYTES)
        .read_to_end(&mut bytes)
        .ok()?;
    cdi::declared_kind(&cdi::spec_text(bytes)?)
}

/// `<dir>/<stem>-<class>.<ext>` for `<dir>/<stem>.<ext>`.
fn beside(file: &Path, class: Class) -> PathBuf {
    let stem = file.file_stem().unwrap_or_default().to_string_lossy();
    let ext = file.extension().unwrap_or_default().to_string_lossy();
    let name = if ext.is_empty() {
        format!("{stem}-{}", class.name())
    } else {
        format!("{stem}-{}.{ext}", class.name())
    };
    file.with_file_name(name)
}

/// Atomically, so that a runtime never reads half a spec; world-readable,
/// as CDI spec directories are read by unprivileged podman too.
fn write_spec(path: &Path, spec: &cdi::Spec) -> Result<(), CdiCmdError> {
    let mut text = serde_json::to_vec_pretty(spec)?;
    text.push(b'\n');
    fsutil::replace_file_mode(path, &text, 0o644).map_err(|source| CdiCmdError::Write {
        path: path.to_path_buf(),
        source,
    })?;
    tracing::info!(path = %path.display(), kind = %spec.kind, devices = spec.devices.len(), "wrote cdi spec");
    Ok(())
}

/// Removes a spec that would name devices that are gone or named elsewhere,
/// saying so on stderr: a run before the driver loaded, or against a wrong
/// `--host-root`, removes the node's spec, and a container asking for a
/// device of it is refused until the next run.
fn remove_stale(path: &Path, why: &str) -> Result<(), CdiCmdError> {
    match std::fs::remove_file(path) {
        Ok(()) => {
            eprintln!("note: removed {}: {why}", path.display());
            Ok(())
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(source) => Err(CdiCmdError::Remove {
            path: path.to_path_buf(),
            source,
        }),
    }
}
