//! `tollgate`: the command-line tool. `tollgate audit plan.toml [--json]` builds a rate-limit
//! plan and reviews it; `tollgate --help` lists the commands, the audit rules and the exit
//! codes.

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
