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
    about = "A scheduler host: book actions at absolute times over REST; kairos runs them from Redis-backed timers."
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

#[derive(Subcommand)]
enum Command {
    /// Run a host: the REST API, the scheduler and the workers. Without --redis-url it
    /// starts a redis-server of its own under --data-dir.
    Serve(Box<ServeArgs>),
    #[command(flatten)]
    Client(ClientCommand),
}

fn init_logging(format: &str) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    if format == "json" {
        builder.json().init();
    } else {
        builder.init();
    }
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    init_logging(&cli.log_format);
    match cli.command {
        Command::Serve(args) => {
            let config = Config::resolve(&args)?;
            kairos::server::serve(config).await
        }
        Command::Client(command) => kairos::cli::run(cli.target, command).await,
    }
}
