//! The nftables ruleset inside a sandbox's network namespace, as an nft JSON
//! document (`nft -j`), and [`apply`], which loads it inside that namespace
//! through the system's libnftables in this process ([`Loader::Library`]),
//! or with `nft -j -f -` run there where the library cannot be loaded. No
//! rule is ever added to the host's namespace.
//!
//! One `inet` table (IPv4 and IPv6 alike), named [`TABLE`]:
//!
//! * `nat_output` (locally generated: a container's processes): DNS (UDP and
//!   TCP port 53, to any address) is redirected to the DNS port; traffic to
//!   the namespace's own addresses (output interface `lo`) is left alone, so
//!   services the sandbox runs on localhost keep working; every other TCP
//!   connection is redirected to the proxy port.
//! * `nat_prerouting` (arriving from outside the namespace: a microVM's tap):
//!   the same redirects. There the kernel redirects to the primary address
//!   of the incoming interface, not to 127.0.0.1, so the daemon's proxy and
//!   DNS sockets must listen on the wildcard address (`0.0.0.0` / `::`)
//!   inside the namespace to serve both paths.
//! * `filter_output`, `filter_input` (policy drop): accept established and
//!   related packets, redirected ones (`ct status dnat`: at the output hook a
//!   redirected packet still carries its original output interface), `lo`,
//!   and IPv6 neighbour discovery. Everything else (other UDP, ICMP to the
//!   outside, unredirected IPv6) is dropped.
//! * `filter_forward` (policy drop): nothing is forwarded.
//! * New IPv4 TCP from the namespace itself to a microVM's guest address
//!   out of its tap is neither redirected nor dropped: it is the
//!   supervisor's ingress dialing an app in the guest
//!   (`supervisor::dial`). Only the supervisor opens sockets in a
//!   microVM's namespace (its guest's traffic arrives on the tap, it is
//!   not output). A container's namespace never has these rules' exemption
//!   in use: it has no tap, and its processes hold no capability there to
//!   make one; a CRI container pod's namespace (whose interfaces CNI
//!   names) does not get the exemption at all.
//!
//! The sandbox cannot change these: the namespace belongs to the host's user
//! namespace, in which sandbox root holds no capability.
//!
//! A CRI pod's sandbox joins the network namespace CNI made instead
//! ([`pod_ruleset`]): the same table without `nat_prerouting`, and
//! `filter_input` also accepts new TCP connections to the pod's own ports
//! (services, probes and other pods reach it at its CNI address), except
//! the proxy's and DNS ports. It replaces only its own table there, never
//! what else the namespace holds.

use std::fs::File;
use std::io::{self, Write};
use std::os::fd::AsRawFd;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use serde_json::{json, Value};

/// The table the rules live in.
pub const TABLE: &str = "sandboxd";

/// Why the rules could not be loaded or read.
#[derive(Debug, thiserror::Error)]
pub enum RulesError {
    #[error("opening network namespace {path}: {source}")]
    Netns { path: String, source: io::Error },
    #[error("running {nft}: {source} (is nftables installed?)")]
    Spawn { nft: String, source: io::Error },
    #[error("nft exited with {status}: {stderr}")]
    Nft { status: String, stderr: String },
    #[error("nft printed JSON we could not read: {0}")]
    Output(String),
    #[error("loading rules through libnftables: {0}")]
    Library(#[from] super::libnftables::LibraryError),
}

/// How a ruleset reaches the kernel.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Loader {
    /// The system's libnftables, in this process.
    Library,
    /// The `nft` binary, run inside the namespace.
    Binary,
}

impl Loader {
    /// The library where it loads, else the binary. For a long-lived
    /// process that loads many rulesets (the daemon, making network
    /// slots); a per-sandbox one (a supervisor) runs the binary: the
    /// library, once loaded, stays mapped there with a malloc arena of the
    /// thread that ran it, about 650 KiB more PSS in every idle sandbox
    /// (measured with `cargo bench --bench scale`).
    pub fn preferred() -> Loader {
        match super::libnftables::library() {
            Some(_) => Loader::Library,
            None => Loader::Binary,
        }
    }
}

fn rule(chain: &str, expr: Vec<Value>) -> Value {
    json!({"add": {"rule": {"family": "inet", "table": TABLE, "chain": chain, "expr": expr}}})
}

fn base_chain(name: &str, ty: &str, hook: &str, prio: i32, policy: &str) -> Value {
    json!({"add": {"chain": {
        "family": "inet", "table": TABLE, "name": name,
        "type": ty, "hook": hook, "prio": prio, "policy": policy
    }}})
}

fn port_match(proto: &str, port: u16) -> Value {
    json!({"match": {"op": "==", "left": {"payload": {"protocol": proto, "field": "dport"}}, "right": port}})
}

fn meta_match(key: &str, value: &str) -> Value {
    json!({"match": {"op": "==", "left": {"meta": {"key": key}}, "right": value}})
}

fn redirect(port: u16) -> Value {
    json!({"redirect": {"port": port}})
}

fn verdict(v: &str) -> Value {
    json!({ v: null })
}

fn established() -> Value {
    json!({"match": {"op": "in", "left": {"ct": {"key": "state"}}, "right": ["established", "related"]}})
}

fn redirected() -> Value {
    json!({"match": {"op": "in", "left": {"ct": {"key": "status"}}, "right": "dnat"}})
}

fn neighbour_discovery() -> Value {
    json!({"match": {"op": "==",
        "left": {"payload": {"protocol": "icmpv6", "field": "type"}},
        "right": {"set": ["nd-neighbor-solicit", "nd-neighbor-advert"]}}})
}

/// The rules that redirect DNS and TCP, shared by both NAT chains.
fn redirect_rules(chain: &str, proxy_port: u16, dns_port: u16) -> Vec<Value> {
    vec![
        rule(chain, vec![port_match("udp", 53), redirect(dns_port)]),
        rule(chain, vec![port_match("tcp", 53), redirect(dns_port)]),
    ]
    .into_iter()
    .chain(std::iter::once(rule(
        chain,
        vec![meta_match("l4proto", "tcp"), redirect(proxy_port)],
    )))
    .collect()
}

/// The whole ruleset as an nft JSON document. It starts by flushing the
/// namespace's ruleset, so applying it twice leaves one copy.
pub fn ruleset(proxy_port: u16, dns_port: u16) -> Value {
    let mut cmds = vec![
        json!({"flush": {"ruleset": null}}),
        json!({"add": {"table": {"family": "inet", "name": TABLE}}}),
        base_chain("nat_output", "nat", "output", -100, "accept"),
        base_chain("nat_prerouting", "nat", "prerouting", -100, "accept"),
        base_chain("filter_output", "filter", "output", 0, "drop"),
        base_chain("filter_input", "filter", "input", 0, "drop"),
        base_chain("filter_forward", "filter", "forward", 0, "drop"),
    ];
    cmds.extend(nat_output_rules(proxy_port, dns_port, true));
    cmds.push(rule(
        "nat_prerouting",
        vec![meta_match("iifname", "lo"), verdict("return")],
    ));
    cmds.extend(redirect_rules("nat_prerouting", proxy_port, dns_port));
    cmds.extend(filter_rules());
    cmds.push(to_guest_rule());
    json!({ "nftables": cmds })
}

/// nat_output: where a microVM's guest may be dialed (`to_guest`), leave
/// the ingress's connections to it alone (every port, DNS's too), then DNS
/// (whatever address it was sent to), then leave the namespace's own
/// addresses alone, then all other TCP to the proxy.
fn nat_output_rules(proxy_port: u16, dns_port: u16, to_guest: bool) -> Vec<Value> {
    let mut rules = redirect_rules("nat_output", proxy_port, dns_port);
    rules.insert(
        2,
        rule(
            "nat_output",
            vec![meta_match("oifname", "lo"), verdict("return")],
        ),
    );
    if to_guest {
        let mut exprs = guest_match();
        exprs.push(verdict("return"));
        rules.insert(0, rule("nat_output", exprs));
    }
    rules
}

/// TCP out of a microVM's tap to its guest's address.
fn guest_match() -> Vec<Value> {
    let [a, b, c, d] = sandbox_proto::VM_GUEST_V4;
    vec![
        meta_match("oifname", super::plumbing::VM_TAP),
        meta_match("nfproto", "ipv4"),
        json!({"match": {"op": "==",
            "left": {"payload": {"protocol": "ip", "field": "daddr"}},
            "right": format!("{a}.{b}.{c}.{d}")}}),
        meta_match("l4proto", "tcp"),
    ]
}

/// filter_output's rule for the ingress's connections to a microVM's
/// guest (see the module's documentation).
fn to_guest_rule() -> Value {
    let mut exprs = guest_match();
    exprs.push(verdict("accept"));
    rule("filter_output", exprs)
}

/// What both filter chains accept before their drop policy.
fn filter_rules() -> Vec<Value> {
    let mut rules = Vec::new();
    for (chain, if_key) in [("filter_output", "oifname"), ("filter_input", "iifname")] {
        rules.push(rule(chain, vec![established(), verdict("accept")]));
        rules.push(rule(chain, vec![redirected(), verdict("accept")]));
        rules.push(rule(
            chain,
            vec![meta_match(if_key, "lo"), verdict("accept")],
        ));
        rules.push(rule(chain, vec![neighbour_discovery(), verdict("accept")]));
    }
    rules
}

/// The ruleset of a CRI pod's namespace (see the module's documentation):
/// it replaces the [`TABLE`] only.
pub fn pod_ruleset(proxy_port: u16, dns_port: u16) -> Value {
    let mut cmds = vec![
        json!({"add": {"table": {"family": "inet", "name": TABLE}}}),
        json!({"flush": {"table": {"family": "inet", "name": TABLE}}}),
        base_chain("nat_output", "nat", "output", -100, "accept"),
        base_chain("filter_output", "filter", "output", 0, "drop"),
        base_chain("filter_input", "filter", "input", 0, "drop"),
        base_chain("filter_forward", "filter", "forward", 0, "drop"),
    ];
    cmds.extend(nat_output_rules(proxy_port, dns_port, false));
    cmds.extend(filter_rules());
    cmds.push(rule(
        "filter_input",
        vec![
            meta_match("l4proto", "tcp"),
            json!({"match": {"op": "!=",
                "left": {"payload": {"protocol": "tcp", "field": "dport"}},
                "right": {"set": [proxy_port, dns_port]}}}),
            verdict("accept"),
        ],
    ));
    json!({ "nftables": cmds })
}

/// The ruleset of a CRI pod's namespace whose sandbox is a microVM: its
/// [`TABLE`] only, as [`pod_ruleset`]. What the guest sends through the
/// tap is redirected to the proxy and DNS server as in a VM's own
/// namespace; new TCP to the pod's address from elsewhere (the pod IP:
/// services, probes, other pods) is forwarded to the guest, except to the
/// proxy and DNS ports; nothing else is forwarded.
pub fn vm_pod_ruleset(proxy_port: u16, dns_port: u16) -> Value {
    let tap = super::plumbing::VM_TAP;
    let [a, b, c, d] = sandbox_proto::VM_GUEST_V4;
    let guest = format!("{a}.{b}.{c}.{d}");
    let not_ours = json!({"match": {"op": "!=",
        "left": {"payload": {"protocol": "tcp", "field": "dport"}},
        "right": {"set": [proxy_port, dns_port]}}});
    let mut cmds = vec![
        json!({"add": {"table": {"family": "inet", "name": TABLE}}}),
        json!({"flush": {"table": {"family": "inet", "name": TABLE}}}),
        base_chain("nat_prerouting", "nat", "prerouting", -100, "accept"),
        base_chain("filter_output", "filter", "output", 0, "drop"),
        base_chain("filter_input", "filter", "input", 0, "drop"),
        base_chain("filter_forward", "filter", "forward", 0, "drop"),
    ];
    let from_guest = meta_match("iifname", tap);
    for redirect_rule in redirect_rules("nat_prerouting", proxy_port, dns_port) {
        let mut rule = redirect_rule;
        if let Some(expr) = rule["add"]["rule"]["expr"].as_array_mut() {
            expr.insert(0, from_guest.clone());
        }
        cmds.push(rule);
    }
    cmds.push(rule(
        "nat_prerouting",
        vec![
            json!({"match": {"op": "!=", "left": {"meta": {"key": "iifname"}}, "right": tap}}),
            meta_match("nfproto", "ipv4"),
            meta_match("l4proto", "tcp"),
            not_ours,
            json!({"dnat": {"family": "ip", "addr": guest}}),
        ],
    ));
    cmds.extend(filter_rules());
    cmds.push(to_guest_rule());
    cmds.push(rule(
        "filter_forward",
        vec![established(), verdict("accept")],
    ));
    cmds.push(rule(
        "filter_forward",
        vec![meta_match("oifname", tap), redirected(), verdict("accept")],
    ));
    json!({ "nftables": cmds })
}

/// Loads [`vm_pod_ruleset`] into the CRI pod namespace at `netns_path`.
pub fn apply_vm_pod(
    loader: Loader,
    netns_path: &Path,
    proxy_port: u16,
    dns_port: u16,
) -> Result<(), RulesError> {
    load(loader, netns_path, &vm_pod_ruleset(proxy_port, dns_port))
}

/// Loads [`pod_ruleset`] into the CRI pod namespace at `netns_path`.
pub fn apply_pod(
    loader: Loader,
    netns_path: &Path,
    proxy_port: u16,
    dns_port: u16,
) -> Result<(), RulesError> {
    load(loader, netns_path, &pod_ruleset(proxy_port, dns_port))
}

/// Runs nft `document` (JSON, or a command) inside the namespace at
/// `netns` with `loader`; returns what nft printed.
fn nft_run(
    loader: Loader,
    netns: &Path,
    args: &[&str],
    document: &str,
) -> Result<Vec<u8>, RulesError> {
    // The binary's callers never load the library (see `Loader::preferred`).
    let library = match loader {
        Loader::Library => super::libnftables::library(),
        Loader::Binary => None,
    };
    match library {
        Some(library) => {
            let ns = File::open(netns).map_err(|source| RulesError::Netns {
                path: netns.display().to_string(),
                source,
            })?;
            Ok(library.run_in(&ns, document)?.into_bytes())
        }
        None => nft_in(netns, args, document.as_bytes()),
    }
}

/// The nft binary: the usual locations, else whatever `PATH` finds.
fn nft_binary() -> PathBuf {
    ["/usr/sbin/nft", "/sbin/nft", "/usr/bin/nft", "/bin/nft"]
        .iter()
        .map(PathBuf::from)
        .find(|p| p.exists())
        .unwrap_or_else(|| PathBuf::from("nft"))
}

/// Runs nft with `args` inside the namespace at `netns`, feeding it `input`.
fn nft_in(netns: &Path, args: &[&str], input: &[u8]) -> Result<Vec<u8>, RulesError> {
    let ns = File::open(netns).map_err(|source| RulesError::Netns {
        path: netns.display().to_string(),
        source,
    })?;
    let fd = ns.as_raw_fd();
    let nft = nft_binary();
    let spawn_err = |source| RulesError::Spawn {
        nft: nft.display().to_string(),
        source,
    };
    let mut cmd = Command::new(&nft);
    cmd.args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    // SAFETY: the closure runs in the forked child before exec and only
    // makes the setns(2) system call (async-signal-safe, no allocation) on
    // `fd`, which `ns` keeps open in the parent until the child has spawned;
    // it is close-on-exec, so nft does not inherit it.
    unsafe {
        cmd.pre_exec(move || {
            if libc::setns(fd, libc::CLONE_NEWNET) != 0 {
                return Err(io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let mut child = cmd.spawn().map_err(spawn_err)?;
    drop(ns);
    if let Some(mut stdin) = child.stdin.take() {
        // A failed write shows up as nft's own error below.
        let _ = stdin.write_all(input);
    }
    let out = child.wait_with_output().map_err(spawn_err)?;
    if !out.status.success() {
        return Err(RulesError::Nft {
            status: out.status.to_string(),
            stderr: String::from_utf8_lossy(&out.stderr).trim().to_string(),
        });
    }
    Ok(out.stdout)
}

/// Loads [`ruleset`] into the namespace pinned at `netns_path` (replacing
/// whatever ruleset it had) with `loader`. Blocking: it waits for the
/// kernel's commit.
pub fn apply(
    loader: Loader,
    netns_path: &Path,
    proxy_port: u16,
    dns_port: u16,
) -> Result<(), RulesError> {
    load(loader, netns_path, &ruleset(proxy_port, dns_port))
}

/// Loads an nft JSON document inside the namespace at `netns_path`.
fn load(loader: Loader, netns_path: &Path, doc: &Value) -> Result<(), RulesError> {
    nft_run(loader, netns_path, &["-j", "-f", "-"], &doc.to_string()).map(|_| ())
}

/// The namespace's ruleset as `nft -j list ruleset` prints it.
pub fn list(netns_path: &Path) -> Result<Value, RulesError> {
    list_with(Loader::preferred(), netns_path)
}

/// [`list`] through `loader`.
pub fn list_with(loader: Loader, netns_path: &Path) -> Result<Value, RulesError> {
    let out = nft_run(
        loader,
        netns_path,
        &["-j", "list", "ruleset"],
        "list ruleset",
    )?;
    serde_json::from_slice(&out).map_err(|e| RulesError::Output(e.to_string()))
}

/// The rule expressions of `chain` in table [`TABLE`] of a listing made by
/// [`list`], in order.
pub fn chain_rules(listing: &Value, chain: &str) -> Vec<Value> {
    listing["nftables"]
        .as_array()
        .map(|items| {
            items
                .iter()
                .filter_map(|item| item.get("rule"))
                .filter(|r| r["table"] == TABLE && r["chain"] == chain)
                .map(|r| r["expr"].clone())
                .collect()
        })
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn adds<'a>(doc: &'a Value, kind: &str) -> Vec<&'a Value> {
        doc["nftables"]
            .as_array()
            .unwrap()
            .iter()
            .filter_map(|c| c["add"].get(kind))
            .collect()
    }

    #[test]
    fn a_pods_rules_replace_only_their_table_and_let_the_pods_ports_in() {
        let doc = pod_ruleset(15001, 15353);
        let cmds = doc["nftables"].as_array().unwrap();
        assert!(
            cmds.iter()
                .all(|c| c.get("flush").is_none_or(|f| f.get("ruleset").is_none())),
            "never the whole ruleset: CNI's namespace may hold others' tables"
        );
        assert_eq!(
            cmds[1],
            json!({"flush": {"table": {"family": "inet", "name": TABLE}}})
        );
        let chains: Vec<&str> = adds(&doc, "chain")
            .iter()
            .map(|c| c["name"].as_str().unwrap())
            .collect();
        assert_eq!(
            chains,
            [
                "nat_output",
                "filter_output",
                "filter_input",
                "filter_forward"
            ],
            "no prerouting redirect: connections to the pod are the pod's"
        );
        let inbound: Vec<&Value> = adds(&doc, "rule")
            .into_iter()
            .filter(|r| r["chain"] == "filter_input")
            .collect();
        let last = inbound.last().unwrap();
        assert_eq!(last["expr"][2], json!({"accept": null}));
        assert_eq!(last["expr"][1]["match"]["op"], "!=");
        assert_eq!(
            last["expr"][1]["match"]["right"],
            json!({"set": [15001, 15353]}),
            "new TCP is let in, except to the proxy and DNS ports"
        );
    }

    #[test]
    fn a_vm_pods_rules_redirect_only_the_guest_and_forward_the_pod_ip_to_it() {
        let doc = vm_pod_ruleset(15001, 15353);
        let cmds = doc["nftables"].as_array().unwrap();
        assert!(
            cmds.iter()
                .all(|c| c.get("flush").is_none_or(|f| f.get("ruleset").is_none())),
            "never the whole ruleset: CNI's namespace may hold others' tables"
        );
        let prerouting: Vec<&Value> = adds(&doc, "rule")
            .into_iter()
            .filter(|r| r["chain"] == "nat_prerouting")
            .collect();
        assert_eq!(prerouting.len(), 4, "{prerouting:?}");
        for redirect in &prerouting[..3] {
            assert_eq!(redirect["expr"][0], meta_match("iifname", "tap0"));
        }
        let inbound = &prerouting[3]["expr"];
        assert_eq!(inbound[0]["match"]["op"], "!=");
        assert_eq!(inbound[3]["match"]["right"], json!({"set": [15001, 15353]}));
        assert_eq!(
            inbound[4],
            json!({"dnat": {"family": "ip", "addr": "10.201.0.2"}})
        );
        // nft itself accepts the document (in a namespace of the check's own).
        let mut check = std::process::Command::new("unshare")
            .args(["-n", "nft", "-c", "-j", "-f", "-"])
            .stdin(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .expect("unshare -n nft");
        use std::io::Write;
        check
            .stdin
            .take()
            .expect("stdin")
            .write_all(doc.to_string().as_bytes())
            .expect("write");
        let out = check.wait_with_output().expect("nft");
        assert!(
            out.status.success(),
            "nft refused the document: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }

    #[test]
    fn document_shape() {
        let doc = ruleset(15001, 15353);
        assert_eq!(doc["nftables"][0], json!({"flush": {"ruleset": null}}));
        let chains = adds(&doc, "chain");
        let summary: Vec<(String, String, String)> = chains
            .iter()
            .map(|c| {
                (
                    c["name"].as_str().unwrap().to_string(),
                    c["hook"].as_str().unwrap().to_string(),
                    c["policy"].as_str().unwrap().to_string(),
                )
            })
            .collect();
        let expect = [
            ("nat_output", "output", "accept"),
            ("nat_prerouting", "prerouting", "accept"),
            ("filter_output", "output", "drop"),
            ("filter_input", "input", "drop"),
            ("filter_forward", "forward", "drop"),
        ];
        assert_eq!(
            summary,
            expect
                .iter()
                .map(|(a, b, c)| (a.to_string(), b.to_string(), c.to_string()))
                .collect::<Vec<_>>()
        );
        for c in &chains {
            assert_eq!(c["family"], "inet");
            assert_eq!(c["table"], TABLE);
        }
    }

    #[test]
    fn nat_output_order_and_ports() {
        let doc = ruleset(15001, 15353);
        let rules: Vec<&Value> = adds(&doc, "rule")
            .into_iter()
            .filter(|r| r["chain"] == "nat_output")
            .collect();
        assert_eq!(rules.len(), 5);
        // The ingress's connections to a microVM's guest go to the guest,
        // on any port (53 too).
        let mut to_guest = guest_match();
        to_guest.push(json!({"return": null}));
        assert_eq!(rules[0]["expr"], json!(to_guest));
        assert_eq!(rules[1]["expr"][0], port_match("udp", 53));
        assert_eq!(rules[1]["expr"][1], json!({"redirect": {"port": 15353}}));
        assert_eq!(rules[2]["expr"][0], port_match("tcp", 53));
        assert_eq!(rules[2]["expr"][1], json!({"redirect": {"port": 15353}}));
        assert_eq!(rules[3]["expr"][1], json!({"return": null}));
        assert_eq!(rules[4]["expr"][0], meta_match("l4proto", "tcp"));
        assert_eq!(rules[4]["expr"][1], json!({"redirect": {"port": 15001}}));
        // A CRI container pod's namespace has no such exemption.
        let pod = pod_ruleset(15001, 15353);
        assert!(adds(&pod, "rule")
            .iter()
            .all(|r| !r["expr"].to_string().contains("tap0")));
        // The VM path redirects the same way.
        let pre: Vec<&Value> = adds(&doc, "rule")
            .into_iter()
            .filter(|r| r["chain"] == "nat_prerouting")
            .collect();
        assert_eq!(pre.len(), 4);
        assert_eq!(pre[3]["expr"][1], json!({"redirect": {"port": 15001}}));
    }

    #[test]
    fn filter_chains_accept_only_redirected_local_and_established() {
        let doc = ruleset(1, 2);
        for chain in ["filter_output", "filter_input"] {
            let rules: Vec<&Value> = adds(&doc, "rule")
                .into_iter()
                .filter(|r| r["chain"] == chain)
                .collect();
            let (common, to_guest) = rules.split_at(4);
            assert!(common
                .iter()
                .all(|r| r["expr"][1] == json!({"accept": null})));
            assert!(common.iter().any(|r| r["expr"][0] == redirected()));
            assert!(common.iter().any(|r| r["expr"][0] == established()));
            // Output only: new TCP out of a microVM's tap to its guest
            // (the ingress).
            let mut guest = guest_match();
            guest.push(json!({"accept": null}));
            match chain {
                "filter_output" => assert_eq!(
                    to_guest.iter().map(|r| &r["expr"]).collect::<Vec<_>>(),
                    [&json!(guest)]
                ),
                _ => assert!(to_guest.is_empty(), "{to_guest:?}"),
            }
        }
        assert!(adds(&doc, "rule")
            .iter()
            .all(|r| r["chain"] != "filter_forward"));
    }

    #[test]
    fn missing_namespace_is_a_clear_error() {
        for loader in [Loader::Library, Loader::Binary] {
            let err = apply(loader, Path::new("/nonexistent/ns"), 1, 2).unwrap_err();
            assert!(matches!(err, RulesError::Netns { .. }), "{loader:?}: {err}");
        }
    }

    #[test]
    fn chain_rules_reads_a_listing() {
        let listing = json!({"nftables": [
            {"metainfo": {}},
            {"rule": {"family": "inet", "table": TABLE, "chain": "x", "handle": 3, "expr": [1]}},
            {"rule": {"family": "inet", "table": "other", "chain": "x", "handle": 4, "expr": [2]}},
        ]});
        assert_eq!(chain_rules(&listing, "x"), vec![json!([1])]);
        assert!(chain_rules(&json!({}), "x").is_empty());
    }
}
