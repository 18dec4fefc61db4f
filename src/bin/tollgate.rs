//! `tollgate`: the command-line tool. `tollgate audit plan.toml [--json]` builds a rate-limit
//! plan and reviews it; `tollgate inspect` and `tollgate reset` look at and reset a key in the
//! shared store, `tollgate top` asks an application's admin API for the keys refused most;
//! `tollgate --help` lists the commands, the audit rules and the exit codes.

#[path = "tollgate/ops.rs"]
mod ops;

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};

/// Exit status: the plan builds and passes the audit (or help and version).
const PASS: u8 = 0;
/// Exit status: the plan does not build or fails the audit.
const FAIL: u8 = 1;
/// Exit status: the arguments, the file or its TOML are unreadable or invalid.
const INVALID: u8 = 2;

/// The text after `--help`: the audit's rules and the exit codes.
fn after_help() -> String {
    let mut out = String::from("Audit rules (see the tollgate::audit docs):\n");
    for r in tollgate::audit::rules() {
        let severity = format!("{:?}", r.severity).to_lowercase();
        out.push_str(&format!(
            "  {} {} ({severity}): {}\n",
            r.id, r.name, r.trips
        ));
    }
    out.push_str(&format!(
        "\nExit codes:\n  {PASS}  the plan builds and passes the audit; --help, --version\n  {FAIL}  the plan does not build or fails the audit (FAIL)\n  {INVALID}  the arguments, the file or its TOML are unreadable or invalid\n"
    ));
    out.push_str(&format!(
        "\ninspect, reset and top exit with {PASS} when done, {FAIL} when the store or the admin API fails,\n{INVALID} for invalid arguments or plans.\n"
    ));
    out
}

/// Rate-limit plans for tollgate: build them and audit them.
#[derive(Debug, Parser)]
#[command(name = "tollgate", version, after_help = after_help())]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Build a plan (without connecting anywhere) and review it: prints PASS or FAIL, the
    /// score, each finding and a recommendation per rule.
    #[command(after_help = after_help())]
    Audit {
        /// The plan file (TOML).
        plan: PathBuf,
        /// Print the report as JSON.
        #[arg(long)]
        json: bool,
    },
    /// Show a key's state under each policy of a route, in the shared store (Redis), charging
    /// nothing: `tollgate inspect plan.toml ip:203.0.113.5 --route /search`.
    Inspect(ops::InspectArgs),
    /// Forget a key's state under every policy of the plan, in the shared store (Redis): its
    /// next request starts afresh on every instance.
    Reset(ops::StoreArgs),
    /// List the keys an application refused most often lately, through its admin API
    /// (feature `admin`): `tollgate top http://127.0.0.1:3000/admin/ratelimit`.
    Top(ops::TopArgs),
}

fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => {
            let code = if e.use_stderr() { INVALID } else { PASS };
            // Nothing useful is left to do if the terminal is gone.
            let _ = e.print();
            return ExitCode::from(code);
        }
    };
    match cli.command {
        Command::Audit { plan, json } => audit(&plan, json),
        Command::Inspect(args) => ops::inspect(&args),
        Command::Reset(args) => ops::reset(&args),
        Command::Top(args) => ops::top(&args),
    }
}

fn audit(path: &std::path::Path, json: bool) -> ExitCode {
    let plan = match tollgate::config::Plan::from_file(path) {
        Ok(plan) => plan,
        Err(e) => {
            eprintln!("{}: {e}", path.display());
            return ExitCode::from(INVALID);
        }
    };
    let report = tollgate::audit(&plan);
    if json {
        match serde_json::to_string_pretty(&report) {
            Ok(text) => println!("{text}"),
            Err(e) => {
                eprintln!("cannot render the report: {e}");
                return ExitCode::from(INVALID);
            }
        }
    } else {
        print!("{}", report.to_text());
    }
    ExitCode::from(if report.pass { PASS } else { FAIL })
}
