//! `tollgate override set|list|remove`: per-key overrides in the shared store, with a plan
//! file, applied by every instance from its next decision.

use std::process::ExitCode;
use std::time::Duration;

use clap::{Args, Subcommand};
use tollgate::{CheckError, Override};

use super::ops::{finish, invalid, limiter, parse_key, print_json, runtime, Failure, StoreArgs};
use super::FAIL;

/// What `tollgate override` does.
#[derive(Debug, Subcommand)]
pub(crate) enum OverrideCommand {
    /// Give KEY another limit under POLICY, in the shared store: `tollgate override set
    /// plan.toml tenant:acme api 5000 --ttl 30d`.
    Set(SetArgs),
    /// List KEY's overrides in force.
    List(StoreArgs),
    /// Remove KEY's override of POLICY: the plan's limit applies again.
    Remove(RemoveArgs),
}

/// `tollgate override set`'s arguments.
#[derive(Debug, Args)]
pub(crate) struct SetArgs {
    #[command(flatten)]
    store: StoreArgs,
    /// The policy's name, as in the plan.
    policy: String,
    /// The limit for this key, per the policy's window.
    limit: u64,
    /// The burst (token bucket and GCRA); without one the capacity is the limit.
    #[arg(long)]
    burst: Option<u64>,
    /// How long the override lasts (`1h`, `30d`); without one, until removed.
    #[arg(long)]
    ttl: Option<String>,
}

/// `tollgate override remove`'s arguments.
#[derive(Debug, Args)]
pub(crate) struct RemoveArgs {
    #[command(flatten)]
    store: StoreArgs,
    /// The policy's name, as in the plan.
    policy: String,
}

pub(crate) fn run(command: &OverrideCommand) -> ExitCode {
    finish(match command {
        OverrideCommand::Set(args) => set(args),
        OverrideCommand::List(args) => list(args),
        OverrideCommand::Remove(args) => remove(args),
    })
}

fn failed(e: CheckError) -> Failure {
    match e {
        CheckError::Invalid(e) => invalid(e.to_string()),
        other => (format!("the store failed: {other}"), FAIL),
    }
}

fn set(args: &SetArgs) -> Result<(), Failure> {
    let key = parse_key(&args.store.key)?;
    let ttl = match &args.ttl {
        Some(text) => Some(
            humantime::parse_duration(text).map_err(|e| invalid(format!("--ttl {text:?}: {e}")))?,
        ),
        None => None,
    };
    let (_, limiter) = limiter(&args.store)?;
    let mut over = Override::new(&args.policy, args.limit);
    if let Some(b) = args.burst {
        over = over.burst(b);
    }
    if let Some(ttl) = ttl {
        over = over.expires_in(ttl);
    }
    runtime()?
        .block_on(limiter.set_override(&key, over))
        .map_err(failed)?;
    let digest = tollgate::key::digest(&key);
    if args.store.json {
        print_json(&serde_json::json!({
            "set": true, "digest": digest, "policy": args.policy, "limit": args.limit,
            "burst": args.burst, "expires_in_ms": ttl.map(|t| t.as_millis() as u64),
        }))
    } else {
        let until = ttl.map_or_else(
            || "until removed".to_owned(),
            |t| format!("for {}", humantime::format_duration(t)),
        );
        println!(
            "key with digest {digest}: {} at {} {until}",
            args.policy, args.limit
        );
        Ok(())
    }
}

fn list(args: &StoreArgs) -> Result<(), Failure> {
    let key = parse_key(&args.key)?;
    let (_, limiter) = limiter(args)?;
    let overrides = runtime()?
        .block_on(limiter.overrides(&key))
        .map_err(failed)?;
    if args.json {
        let items: Vec<_> = overrides
            .iter()
            .map(|o| {
                serde_json::json!({
                    "policy": o.policy(), "limit": o.limit(), "capacity": o.capacity(),
                    "expires_in_ms": o.expires_in().map(|d| d.as_millis() as u64),
                })
            })
            .collect();
        return print_json(&serde_json::json!({ "overrides": items }));
    }
    if overrides.is_empty() {
        println!("no override: the plan's limits apply");
    }
    for o in &overrides {
        let until = o.expires_in().map_or_else(
            || "until removed".to_owned(),
            |d| {
                format!(
                    "for {}",
                    humantime::format_duration(Duration::from_secs(d.as_secs()))
                )
            },
        );
        println!(
            "{}: limit {} (capacity {}) {until}",
            o.policy(),
            o.limit(),
            o.capacity()
        );
    }
    Ok(())
}

fn remove(args: &RemoveArgs) -> Result<(), Failure> {
    let key = parse_key(&args.store.key)?;
    let (_, limiter) = limiter(&args.store)?;
    runtime()?
        .block_on(limiter.remove_override(&key, &args.policy))
        .map_err(failed)?;
    if args.store.json {
        print_json(&serde_json::json!({ "removed": true, "policy": args.policy }))
    } else {
        println!("removed: {} applies its plan's limit again", args.policy);
        Ok(())
    }
}
