//! The `kairos` binary: `kairos serve` runs a host (see `kairos serve --help`).

use clap::{Parser, Subcommand};

/// mimalloc instead of glibc malloc: a profile of the firing engine at 10k+ fires/s spent
/// about a quarter of its CPU in glibc's allocator (many small, short-lived buffers for
/// HTTP and Redis requests across tokio's worker threads).
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;
use kairos::cli::{ClientCommand, Target};
use kairos::config::{Config, ServeArgs};

#[derive(Parser)]
#[command(
    name = "kairos",
    version,
    about = "A scheduler host: book actions at absolute times over REST; kairos runs them from Redis-backed timers.",
    mut_subcommand("serve", without_client_flags)
)]
struct Cli {
    /// Log format: text or json.
    #[arg(long, env = "KAIROS_LOG_FORMAT", default_value = "text", global = true)]
    log_format: String,
    #[command(flatten)]
    target: Target,
    #[command(subcommand)]
    command: Command,
}

/// What `serve --help` says of logs below the flags.
const LOGGING_HELP: &str = "Logging: RUST_LOG chooses what is logged, in tracing's filter syntax \
(default `info`): RUST_LOG=debug for everything, RUST_LOG=warn,kairos::queues=debug for one \
module. --log-format json (KAIROS_LOG_FORMAT) writes one JSON object a line.";

/// `serve` runs a host, not a client: the client's global flags (`--server`, `--token`,
/// `--output`) are left out of its help. clap gives a subcommand a global flag only when
/// it has no argument of that id, so a hidden one of each takes its place (its value
/// still reaches [`Target`], of the same type, and nothing in a host reads it).
fn without_client_flags(serve: clap::Command) -> clap::Command {
    let hidden = |id: &'static str| clap::Arg::new(id).long(id).hide(true);
    serve.arg(hidden("server")).arg(hidden("token")).arg(
        hidden("output").value_parser(clap::builder::EnumValueParser::<kairos::cli::Output>::new()),
    )
}

#[derive(Subcommand)]
enum Command {
    /// Run a host: the REST API, the scheduler and the workers. Without --redis-url it
    /// starts a redis-server of its own under --data-dir.
    #[command(after_help = LOGGING_HELP)]
    Serve(Box<ServeArgs>),
    /// Bring a keyspace written by an earlier kairos over to this version's layout, in
    /// place: before shards (layout 1, on its standalone Redis) or with a hash per Plan
    /// (layout 2). Stop every host first; safe to run again if cut off. See
    /// docs/operations.md.
    Migrate(MigrateArgs),
    /// Where an object's keys are in Redis: its shard and the prefix of its keys, to
    /// read them with redis-cli (no server needed).
    Where(WhereArgs),
    /// Print the runs the shards' `runs` streams hold (hosts started with
    /// --runs-stream-max-len N keep about the last N per shard) as JSON lines, one run
    /// a line, to keep full history elsewhere: `kairos export-runs --follow >> runs.jsonl`.
    /// Reads Redis directly; writes nothing there.
    ExportRuns(ExportRunsArgs),
    /// Print Redis's slow log (`SLOWLOG GET`) with kairos's script calls named
    /// (`finish_life`, not `EVALSHA 3f1c…`), and the logged time by script. Reads only;
    /// Redis logs calls slower than its `slowlog-log-slower-than` (10 ms by default).
    Slowlog(SlowlogArgs),
    /// Print a shell completion script: `kairos completions bash > /etc/bash_completion.d/kairos`,
    /// `kairos completions zsh > "${fpath[1]}/_kairos"`, `kairos completions fish >
    /// ~/.config/fish/completions/kairos.fish`.
    Completions { shell: clap_complete::Shell },
    #[command(flatten)]
    Client(ClientCommand),
}

#[derive(clap::Args)]
struct MigrateArgs {
    /// The Redis holding the keyspace.
    #[arg(long, env = "KAIROS_REDIS_URL")]
    redis_url: String,
    /// Prefix of the keyspace's keys.
    #[arg(long, env = "KAIROS_KEY_PREFIX", default_value = "kairos")]
    key_prefix: String,
    /// Shards of the new layout (fixed from then on) [default: 32].
    #[arg(long, env = "KAIROS_SHARDS")]
    shards: Option<u32>,
    /// Migrate even if hosts of the earlier version look alive.
    #[arg(long)]
    force: bool,
}

#[derive(clap::Args)]
struct ExportRunsArgs {
    /// The Redis (or `redis+cluster://` nodes) holding the keyspace.
    #[arg(long, env = "KAIROS_REDIS_URL")]
    redis_url: String,
    /// Prefix of the keyspace's keys.
    #[arg(long, env = "KAIROS_KEY_PREFIX", default_value = "kairos")]
    key_prefix: String,
    /// After what the streams hold, go on printing runs as they are recorded (until
    /// stopped).
    #[arg(long)]
    follow: bool,
}

#[derive(clap::Args)]
struct SlowlogArgs {
    /// The Redis (or `redis+cluster://` nodes, each read on its own).
    #[arg(long, env = "KAIROS_REDIS_URL")]
    redis_url: String,
    /// Entries to read from each node, newest first.
    #[arg(long, default_value_t = 128)]
    count: usize,
}

#[derive(clap::Args)]
#[group(required = true, multiple = true)]
struct WhereArgs {
    /// Shards of the keyspace (see `HGET kairos:meta shards`).
    #[arg(long, default_value_t = kairos::store::DEFAULT_SHARDS)]
    shards: u32,
    /// Prefix of the keyspace's keys.
    #[arg(long, env = "KAIROS_KEY_PREFIX", default_value = "kairos")]
    key_prefix: String,
    /// A Life's id (with --resource when it was booked with one).
    #[arg(long)]
    life: Option<String>,
    /// A resource id.
    #[arg(long)]
    resource: Option<String>,
    /// A timer's name.
    #[arg(long)]
    timer: Option<String>,
    /// A queue's name (its tasks are in the same shard).
    #[arg(long)]
    queue: Option<String>,
    /// A queue task, as QUEUE/NAME.
    #[arg(long)]
    task: Option<String>,
}

fn where_is(args: &WhereArgs) -> anyhow::Result<()> {
    use kairos::store::{Placement, ShardKeys};
    if !(1..=kairos::store::MAX_SHARDS).contains(&args.shards) {
        anyhow::bail!("--shards must be 1 to {}", kairos::store::MAX_SHARDS);
    }
    let p = Placement {
        shards: args.shards,
    };
    let line = |what: String, shard: u32| {
        let keys = ShardKeys::new(&args.key_prefix, shard, args.shards);
        println!("{what}: shard {shard}, keys under {}", keys.prefix);
    };
    match (&args.life, &args.resource) {
        (Some(id), rid) => {
            let shard = p.life(id, rid.as_deref());
            line(format!("life {id}"), shard);
            let home = p.home(id);
            if home != shard {
                let keys = ShardKeys::new(&args.key_prefix, home, args.shards);
                println!("  found by id through {}", keys.pointer(id));
            }
            let keys = ShardKeys::new(&args.key_prefix, shard, args.shards);
            println!(
                "  its record: redis-cli {}",
                kairos::store::inspect::read_life_command(&keys, id)
            );
            println!(
                "  its Plans claimed or running: redis-cli HMGET '{}' '{id}:birth' '{id}:death'",
                keys.inflight()
            );
        }
        (None, Some(rid)) => line(format!("resource {rid}"), p.resource(rid)),
        (None, None) => {}
    }
    let keys = |shard: u32| ShardKeys::new(&args.key_prefix, shard, args.shards);
    if let Some(name) = &args.timer {
        let shard = p.timer(name);
        line(format!("timer {name}"), shard);
        println!("  redis-cli HGETALL '{}'", keys(shard).timer(name));
        println!(
            "  its Plan: redis-cli HGETALL '{}'",
            keys(shard).timer_plan(name)
        );
    }
    if let Some(name) = &args.queue {
        let shard = p.queue(name);
        line(format!("queue {name}"), shard);
        println!("  redis-cli HGETALL '{}'", keys(shard).queue(name));
    }
    if let Some(task) = &args.task {
        let Some((queue, name)) = task.split_once('/') else {
            anyhow::bail!("--task is QUEUE/NAME");
        };
        let shard = p.queue(queue);
        line(format!("task {task}"), shard);
        println!(
            "  redis-cli {}",
            kairos::store::inspect::read_task_command(&keys(shard), queue, name)
        );
    }
    Ok(())
}

/// A client command whose output is cut short (`kairos ls | head`) ends quietly, as
/// Unix tools do, instead of panicking on the broken pipe. Only for client commands: the
/// server keeps SIGPIPE ignored, so a closed socket is an error, not the end.
fn exit_quietly_on_closed_stdout() {
    // SAFETY: restores the default disposition of one signal before any other thread
    // writes to stdout; no handler runs Rust code.
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
    }
}

fn init_logging(format: &str) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    // Colour only on a terminal: a log written to a file or a pipe stays plain text.
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_writer(std::io::stderr);
    if format == "json" {
        builder.json().init();
    } else {
        builder.init();
    }
}

fn main() -> anyhow::Result<()> {
    quiet_library_backtraces();
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?
        .block_on(run())
}

/// `RUST_BACKTRACE=1` keeps its panic backtraces, but errors stop capturing one each,
/// unless `RUST_LIB_BACKTRACE` says otherwise: wasmtime makes an error whenever it drops
/// a plugin run's store, and with a backtrace captured for each a no-op invocation took
/// 19 µs instead of 12 (`cargo bench -p kairos --bench plugins`). Set before any thread
/// starts, so that nothing reads the environment while it changes.
fn quiet_library_backtraces() {
    if std::env::var_os("RUST_LIB_BACKTRACE").is_none() {
        std::env::set_var("RUST_LIB_BACKTRACE", "0");
    }
}

async fn run() -> anyhow::Result<()> {
    let cli = Cli::parse();
    init_logging(&cli.log_format);
    match cli.command {
        Command::Serve(args) => {
            let config = Config::resolve(&args)?;
            kairos::server::serve(config).await
        }
        Command::Migrate(args) => {
            let report = kairos::store::migrate::migrate(
                &args.redis_url,
                &args.key_prefix,
                args.shards,
                args.force,
            )
            .await
            .map_err(anyhow::Error::msg)?;
            for line in report.summary() {
                println!("{line}");
            }
            Ok(())
        }
        Command::Where(args) => where_is(&args),
        Command::ExportRuns(args) => {
            exit_quietly_on_closed_stdout();
            let stdout = std::io::stdout();
            let mut out = std::io::BufWriter::new(stdout.lock());
            kairos::store::runs::export(&args.redis_url, &args.key_prefix, args.follow, &mut out)
                .await
                .map_err(anyhow::Error::msg)?;
            Ok(())
        }
        Command::Slowlog(args) => {
            exit_quietly_on_closed_stdout();
            let logs = kairos::store::slowlog::read(&args.redis_url, args.count)
                .await
                .map_err(anyhow::Error::msg)?;
            let stdout = std::io::stdout();
            let _ = kairos::store::slowlog::print(&logs, &mut stdout.lock());
            Ok(())
        }
        Command::Completions { shell } => {
            exit_quietly_on_closed_stdout();
            use clap::CommandFactory;
            clap_complete::generate(shell, &mut Cli::command(), "kairos", &mut std::io::stdout());
            Ok(())
        }
        Command::Client(command) => {
            exit_quietly_on_closed_stdout();
            kairos::cli::run(cli.target, command).await
        }
    }
}
