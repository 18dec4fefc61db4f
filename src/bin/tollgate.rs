//! `tollgate`: the command-line tool. `tollgate audit plan.toml [--json]` builds a rate-limit
//! plan and reviews it; `tollgate edge nginx|cloudflare|aws-waf|envoy plan.toml` exports its
//! `[edge]` rules; `tollgate inspect` and `tollgate reset` look at and reset a key in the
//! shared store, `tollgate override set|list|remove` manages per-key overrides there,
//! `tollgate unlock` clears a login limit of a username or a client, `tollgate top` asks an
//! application's admin API for the keys refused most;
//! `tollgate --help` lists the commands, the audit rules and the exit codes.

#[path = "tollgate/ops.rs"]
mod ops;
#[path = "tollgate/overrides.rs"]
mod overrides;

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
        "\nExit codes:\n  {PASS}  the plan builds and passes the audit; --help, --version\n  {FAIL}  the plan does not build or fails the audit (FAIL); edge: the rules cannot be exported\n  {INVALID}  the arguments, the file or its TOML are unreadable or invalid\n"
    ));
    out.push_str(&format!(
        "\ninspect, reset, unlock and top exit with {PASS} when done, {FAIL} when the store or the admin API fails,\n{INVALID} for invalid arguments or plans.\n"
    ));
    out
}

/// Rate-limit plans for tollgate: build them, audit them, export their edge limits.
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
    /// Export the plan's [edge] rules to an edge: nginx (limit_req and real_ip, a server
    /// block to include in http {}), cloudflare (a Rulesets API body for the http_ratelimit
    /// phase), aws-waf (a web ACL's Rules list of rate-based rules) or envoy (the local rate
    /// limit filter and its per-route token buckets, YAML). The configuration goes to stdout,
    /// notes on rounding and target differences to stderr; a limit the target cannot express
    /// fails, naming the field and the target's constraint.
    #[command(after_help = EDGE_HELP)]
    Edge {
        /// The edge to export to.
        #[arg(value_parser = ["nginx", "cloudflare", "aws-waf", "envoy"])]
        target: String,
        /// The plan file (TOML, or JSON when it ends in .json).
        plan: PathBuf,
        /// Where a conversion must round, round toward the stricter limit (and say so)
        /// instead of failing.
        #[arg(long)]
        round_stricter: bool,
        /// nginx: the server's `listen` parameter.
        #[arg(long, default_value = "80")]
        listen: String,
        /// nginx: the origin to proxy to (host:port).
        #[arg(long, default_value = "127.0.0.1:3000")]
        origin: String,
    },
    /// Show a key's state under each policy of a route, in the shared store (Redis), charging
    /// nothing: `tollgate inspect plan.toml ip:203.0.113.5 --route /search`.
    Inspect(ops::InspectArgs),
    /// Forget a key's state under every policy of the plan, in the shared store (Redis): its
    /// next request starts afresh on every instance.
    Reset(ops::StoreArgs),
    /// Clear a login limit of the plan's [login] guard in the shared store (Redis): a
    /// username's (`--user alice`, the account locked by failed guesses) or a client's
    /// (`--ip ip:192.0.2.7`).
    Unlock(ops::UnlockArgs),
    /// List the keys an application refused most often lately, through its admin API
    /// (feature `admin`): `tollgate top http://127.0.0.1:3000/admin/ratelimit`.
    Top(ops::TopArgs),
    /// Per-key overrides in the shared store (Redis): another limit for one key under one
    /// policy, applied by every instance from its next request.
    #[command(subcommand)]
    Override(overrides::OverrideCommand),
}

/// The text after `tollgate edge --help`.
const EDGE_HELP: &str = "Examples:
  tollgate edge nginx plan.toml --listen 8080 --origin 127.0.0.1:3000 > edge.conf   # include it in http {}
  tollgate edge cloudflare plan.toml > ratelimit.json   # PUT .../rulesets/phases/http_ratelimit/entrypoint
  tollgate edge aws-waf plan.toml > rules.json          # aws wafv2 update-web-acl --rules file://rules.json ...
  tollgate edge envoy plan.toml > edge.yaml

  Both the Cloudflare PUT and `aws wafv2 update-web-acl --rules` replace every rule already
  there (in that phase, in that web ACL): merge the exported rules with your own first.

Exit codes:
  0  the configuration is on stdout
  1  the plan's [edge] rules cannot be exported to this target (the field and the constraint are named)
  2  the arguments, the file or its TOML/JSON are unreadable or invalid
";

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
        Command::Edge {
            target,
            plan,
            round_stricter,
            listen,
            origin,
        } => edge(&target, &plan, round_stricter, listen, origin),
        Command::Inspect(args) => ops::inspect(&args),
        Command::Reset(args) => ops::reset(&args),
        Command::Unlock(args) => ops::unlock(&args),
        Command::Top(args) => ops::top(&args),
        Command::Override(command) => overrides::run(&command),
    }
}

fn edge(
    target: &str,
    path: &std::path::Path,
    round_stricter: bool,
    listen: String,
    origin: String,
) -> ExitCode {
    let target = match target.parse::<tollgate::config::edge::EdgeTarget>() {
        Ok(target) => target,
        Err(e) => {
            eprintln!("{e}");
            return ExitCode::from(INVALID);
        }
    };
    let plan = match tollgate::config::Plan::from_file(path) {
        Ok(plan) => plan,
        Err(e) => {
            eprintln!("{}: {e}", path.display());
            return ExitCode::from(INVALID);
        }
    };
    let options = tollgate::config::edge::ExportOptions::new()
        .round_stricter(round_stricter)
        .listen(listen)
        .origin(origin);
    match plan.export_edge(target, &options) {
        Ok(export) => {
            for note in export.notes() {
                eprintln!("note: {note}");
            }
            print!("{}", export.text());
            ExitCode::from(PASS)
        }
        Err(e) => {
            eprintln!("{}: {e}", path.display());
            ExitCode::from(FAIL)
        }
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
