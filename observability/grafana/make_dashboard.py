#!/usr/bin/env python3
"""Writes tollgate-dashboard.json (the Grafana dashboard) beside this file: edit the panels
here and run `python3 observability/grafana/make_dashboard.py`. tests/alert_rules.rs checks
the queries with promtool and against the metric names tollgate records."""
import os
import json
ds = {"type": "prometheus", "uid": "${datasource}"}
def sel(extra=""):
    inner = 'job=~"$job"' + ("," + extra if extra else "")
    return "{" + inner + "}"
ALL = sel()
REFUSED = sel('allowed="false"')
panels = []
def ts(title, exprs, unit="short", desc="", stack=False):
    panels.append({
        "id": len(panels) + 1, "type": "timeseries", "title": title, "description": desc, "datasource": ds,
        "fieldConfig": {"defaults": {"unit": unit, "custom": {"fillOpacity": 10, "stacking": {"mode": "normal" if stack else "none"}}}, "overrides": []},
        "options": {"legend": {"displayMode": "table", "placement": "bottom", "calcs": ["mean", "max"]}, "tooltip": {"mode": "multi"}},
        "targets": [{"datasource": ds, "refId": chr(65 + k), "expr": e, "legendFormat": l} for k, (e, l) in enumerate(exprs)],
    })
R = "[$__rate_interval]"


def rate_by(by, metric, selector=ALL, fn="rate"):
    """`sum by (by) (rate(metric{selector}[$__rate_interval]))`; `by` may be empty."""
    grouping = f" by ({by}) " if by else ""
    return f"sum{grouping}({fn}({metric}{selector}{R}))"


def p(q):
    """The `q` quantile of the store latency, by store."""
    return f"histogram_quantile({q}, {rate_by('store, le', 'tollgate_store_latency_seconds_bucket')})"


PANELS = [
    ("Decisions by outcome", "reqps", True,
     "tollgate_decisions_total: every decision a store or failure mode took.",
     [(rate_by("outcome, allowed", "tollgate_decisions_total"), "{{outcome}} allowed={{allowed}}")]),
    ("Refused share by route and policy", "percentunit", False,
     "The share of each route's decisions a policy refused (alert TollgatePolicyRefusingShare). "
     "Which keys: GET /top on the admin API, or `tollgate top`.",
     [(rate_by("route, policy", "tollgate_decisions_total", REFUSED) + " / ignoring(policy) group_left "
       + rate_by("route", "tollgate_decisions_total"), "{{route}} / {{policy}}")]),
    ("Refusals by kind", "reqps", True,
     "tollgate_refusals_total: every answer tollgate gave instead of the service (429, 400, 403, 503, login refusals).",
     [(rate_by("kind", "tollgate_refusals_total"), "{{kind}}")]),
    ("Degraded decisions per minute (store failed)", "short", False,
     "Decisions a failure mode took because the store failed "
     "(alerts TollgateFailOpen, TollgateLocalFallback, TollgateFailClosed).",
     [(rate_by("outcome", "tollgate_degraded_total") + " * 60", "{{outcome}}")]),
    ("Store latency", "s", False,
     "Calls a ResilientStore makes to the store it wraps, timeouts included (alert TollgateStoreSlow).",
     [(p(0.5), "p50 {{store}}"), (p(0.99), "p99 {{store}}")]),
    ("Store errors by kind", "reqps", True,
     "tollgate_store_errors_total: failed calls to the store, by kind (alert TollgateStoreErrors). "
     "Requests an open breaker kept from the store are not calls: see the degraded decisions.",
     [(rate_by("kind", "tollgate_store_errors_total"), "{{kind}}")]),
    ("Circuit breaker transitions", "short", False,
     "Transitions by the state entered (alert TollgateCircuitBreakerOpen).",
     [(rate_by("instance, state", "tollgate_breaker_transitions_total", fn="increase"), "{{instance}} {{state}}")]),
    ("Memory store evictions and fallback over-admissions", "reqps", False,
     "A full memory store evicting live keys (raise max_keys), and requests the local fallback "
     "admitted that the store, answering late, refused.",
     [(rate_by("", "tollgate_memory_evictions_total"), "memory evictions"),
      (rate_by("", "tollgate_fallback_overadmitted_total"), "fallback over-admitted")]),
    ("Leased quota units", "short", False,
     "LeasedStore blocks: units granted by the lease ledger, units given back unused, and units "
     "dropped (a Redis restart or a failed return): dropped units are under-admission until their "
     "window or refill frees them, never over-admission.",
     [(rate_by("event", "tollgate_lease_units_total") + " * 60", "{{event}} per minute")]),
    ("Plan reloads", "short", False,
     "Plans put in force while the service runs (Limiter::reload_plan, PlanWatcher), and plans "
     "refused (they failed to build or the audit): the plan in force stayed.",
     [(rate_by("instance, result", "tollgate_plan_reloads_total", fn="increase"), "{{instance}} {{result}}")]),
]
for title, unit, stack, desc, exprs in PANELS:
    ts(title, exprs, unit, desc, stack)
for i, p in enumerate(panels):
    p["gridPos"] = {"h": 8, "w": 12, "x": (i % 2) * 12, "y": (i // 2) * 8}
dash = {
    "title": "tollgate rate limiting", "uid": "tollgate",
    "description": "tollgate's metrics (feature `metrics`): decisions, refusals, degraded decisions, store latency and errors, circuit breaker.",
    "tags": ["tollgate", "rate-limiting"], "schemaVersion": 39, "version": 1, "editable": True,
    "time": {"from": "now-1h", "to": "now"}, "refresh": "30s",
    "templating": {"list": [
        {"name": "datasource", "type": "datasource", "query": "prometheus", "label": "Data source", "current": {}},
        {"name": "job", "type": "query", "label": "Job", "datasource": ds,
         "query": {"query": "label_values(tollgate_decisions_total, job)", "refId": "job"},
         "definition": "label_values(tollgate_decisions_total, job)", "includeAll": True, "multi": True,
         "allValue": ".*", "current": {"text": "All", "value": "$__all"}, "refresh": 2},
    ]},
    "annotations": {"list": []}, "panels": panels,
}
with open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "tollgate-dashboard.json"), "w") as f:
    json.dump(dash, f, indent=2)
    f.write("\n")
