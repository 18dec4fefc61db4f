//! `tollgate audit plan.toml [--json]`: reviews a rate-limit plan; exits 1 when it fails,
//! 2 when the file is unreadable or invalid.

use std::process::ExitCode;

fn usage() -> ExitCode {
    eprintln!("usage: tollgate audit <plan.toml> [--json]");
    ExitCode::from(2)
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let json = args.iter().any(|a| a == "--json");
    let rest: Vec<&String> = args.iter().filter(|a| *a != "--json").collect();
    let [command, path] = rest.as_slice() else {
        return usage();
    };
    if command.as_str() != "audit" {
        return usage();
    }
    let plan = match tollgate::config::Plan::from_file(path.as_str()) {
        Ok(plan) => plan,
        Err(e) => {
            eprintln!("{path}: {e}");
            return ExitCode::from(2);
        }
    };
    let report = tollgate::audit(&plan);
    if json {
        match serde_json::to_string_pretty(&report) {
            Ok(text) => println!("{text}"),
            Err(e) => {
                eprintln!("cannot render the report: {e}");
                return ExitCode::from(2);
            }
        }
    } else {
        print!("{}", report.to_text());
    }
    if report.pass {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    }
}
