//! The files an operator installs (`deploy/`) are checked offline: the systemd unit
//! passes `systemd-analyze verify` with this build's server as its program, and it
//! refuses to restart exactly the exit codes that a restart cannot mend. The
//! Kubernetes manifests (`deploy/kubernetes/`) pass the Kubernetes API's schemas,
//! strictly, with `kubernetes-validate` (PyPI; installed into a virtual environment
//! under /var/cache/leasehold on first use, offline from then on); they agree with
//! each other and with the server's flags; and their start script gives pod N the
//! node id N + 1. Each check is shown to fail on a broken copy.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;

use leasehold_jepsen::cluster::binary;
use leasehold_server::node::config::RawConfig;
use leasehold_server::node::running_node::EXIT_DATA_DIRECTORY_REFUSED;
use leasehold_server::raft::incarnations::{EXIT_BUILD_TOO_OLD, EXIT_STALE_INCARNATION};
use serde_json::Value;

/// Where the unit calls the server; the test puts the built one there.
const INSTALLED_SERVER: &str = "/usr/local/bin/leasehold-server";
/// `leasehold-server` exits 2 on invalid configuration (src/main.rs).
const EXIT_INVALID_CONFIGURATION: i32 = 2;

fn unit_text() -> String {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../deploy/systemd/leasehold@.service");
    std::fs::read_to_string(&path).unwrap_or_else(|error| panic!("read {}: {error}", path.display()))
}

/// `systemd-analyze verify` of `text` as the instance `leasehold@node1.service`: its
/// complaints, empty when it has none; None when systemd-analyze is not installed.
fn verify(text: &str, directory: &Path) -> Option<String> {
    let unit = directory.join("leasehold@node1.service");
    std::fs::write(&unit, text).unwrap();
    let output = match Command::new("systemd-analyze").arg("verify").arg(&unit).output() {
        Ok(output) => output,
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => return None,
        Err(error) => panic!("run systemd-analyze: {error}"),
    };
    let mut complaints = String::from_utf8_lossy(&output.stdout).into_owned();
    complaints.push_str(&String::from_utf8_lossy(&output.stderr));
    if !output.status.success() && complaints.trim().is_empty() {
        complaints = format!("exited with {}", output.status);
    }
    Some(complaints.trim().to_string())
}

#[test]
fn the_systemd_unit_verifies_and_a_broken_one_does_not() {
    let directory = tempfile::tempdir().unwrap();
    let server = binary("leasehold-server");
    let text = unit_text();
    assert!(text.contains(INSTALLED_SERVER), "the unit runs {INSTALLED_SERVER}");
    let unit = text.replace(INSTALLED_SERVER, server.to_str().unwrap());
    let Some(complaints) = verify(&unit, directory.path()) else {
        eprintln!("skipped: systemd-analyze is not installed (Debian's systemd package has it)");
        return;
    };
    assert_eq!(complaints, "", "systemd-analyze verify complained about deploy/systemd/leasehold@.service");

    // The check finds what it is for: a key systemd does not know (a misspelt one),
    // a program that is not there.
    let misspelt = unit.replace("RestartSec=2s", "RestartSecs=2s");
    let complaints = verify(&misspelt, directory.path()).unwrap();
    assert!(complaints.contains("Unknown key"), "{complaints}");
    let missing = text.replace(INSTALLED_SERVER, "/nonexistent/leasehold-server");
    let complaints = verify(&missing, directory.path()).unwrap();
    assert!(complaints.contains("is not executable"), "{complaints}");
}

#[test]
fn the_unit_does_not_restart_a_node_that_a_restart_cannot_mend() {
    let text = unit_text();
    let line = text
        .lines()
        .find_map(|line| line.strip_prefix("RestartPreventExitStatus="))
        .expect("a RestartPreventExitStatus= line");
    let mut codes: Vec<i32> = line.split_whitespace().map(|code| code.parse().expect("a number")).collect();
    codes.sort_unstable();
    let mut expected = vec![
        EXIT_INVALID_CONFIGURATION,
        i32::from(EXIT_DATA_DIRECTORY_REFUSED),
        EXIT_STALE_INCARNATION,
        EXIT_BUILD_TOO_OLD,
    ];
    expected.sort_unstable();
    assert_eq!(codes, expected, "invalid configuration, a refused directory, a stale incarnation, an older build");
    assert!(text.contains("\nRestart=on-failure\n"), "every other failure is restarted");
    assert!(text.contains("\nExecReload=/bin/kill -HUP $MAINPID\n"), "reload is SIGHUP");
    assert!(text.contains("--config /etc/leasehold/%i.toml"), "one configuration file per instance");
}

/// The validator, from PyPI: it bundles the Kubernetes API's JSON schemas, so it needs
/// the network only to be installed. Its version is part of the virtual environment's
/// path, so a new pin makes a new environment.
const KUBERNETES_VALIDATE_VERSION: &str = "1.37.0";
/// The Kubernetes versions whose schemas the manifests must pass: the oldest the
/// manifests are meant for and the newest the validator knows.
const KUBERNETES_VERSIONS: [&str; 2] = ["1.31.0", "1.37.0"];
/// Where the validator's virtual environment is made, beside the stores' (scripts/stores.sh).
const VALIDATOR_PARENT: &str = "/var/cache/leasehold";
/// Not in kustomization.yaml (applying placeholders would replace real keys), but the
/// layout the StatefulSet mounts: checked like the rest.
const SECRETS_EXAMPLE: &str = "secrets.example.yaml";
/// The server's cluster-internal names end in this (the cluster's DNS domain).
const CLUSTER_DOMAIN: &str = "svc.cluster.local";
/// A stopping node waits this long for its tasks (`running_node::SHUTDOWN_WAIT`); the
/// grace period before a SIGKILL must be longer.
const SHUTDOWN_WAIT_S: i64 = 2;

fn kubernetes_directory() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../deploy/kubernetes")
}

/// The virtual environment holding `kubernetes-validate` (and PyYAML, which the checks
/// below read the manifests with), made on first use; or why it cannot be made.
fn validator_environment() -> Result<PathBuf, String> {
    let parent = Path::new(VALIDATOR_PARENT);
    std::fs::create_dir_all(parent).map_err(|error| format!("cannot create {VALIDATOR_PARENT}: {error}"))?;
    let environment = parent.join(format!("kubernetes-validate-{KUBERNETES_VALIDATE_VERSION}-venv"));
    if environment.join("bin/kubernetes-validate").exists() {
        return Ok(environment);
    }
    eprintln!("installing kubernetes-validate=={KUBERNETES_VALIDATE_VERSION} into {} (PyPI)", environment.display());
    // One installer at a time (tests run in parallel processes); a half-made environment
    // is made again.
    let script = r#"[ -x "$1/bin/kubernetes-validate" ] && exit 0
rm -rf "$1"
python3 -m venv "$1" && "$1/bin/pip" install --quiet "kubernetes-validate==$2""#;
    let output = Command::new("flock")
        .arg(parent.join("kubernetes-validate.lock"))
        .args(["sh", "-c", script, "sh"])
        .arg(&environment)
        .arg(KUBERNETES_VALIDATE_VERSION)
        .output()
        .map_err(|error| format!("cannot run flock and python3 (util-linux, python3-venv): {error}"))?;
    if !output.status.success() {
        return Err(format!(
            "installing kubernetes-validate failed ({}): {}",
            output.status,
            String::from_utf8_lossy(&output.stderr).trim()
        ));
    }
    Ok(environment)
}

/// The validator's environment, or None after printing why the test is skipped.
fn validator_or_skip() -> Option<PathBuf> {
    match validator_environment() {
        Ok(environment) => Some(environment),
        Err(reason) => {
            eprintln!("skipped: {reason}");
            None
        }
    }
}

/// Every YAML document in `path`, as JSON values.
fn yaml_documents(environment: &Path, path: &Path) -> Vec<Value> {
    let program = "import json, sys, yaml\nprint(json.dumps([d for d in yaml.safe_load_all(open(sys.argv[1])) if d]))";
    let output = Command::new(environment.join("bin/python")).args(["-c", program]).arg(path).output().unwrap();
    assert!(output.status.success(), "read {}: {}", path.display(), String::from_utf8_lossy(&output.stderr));
    serde_json::from_slice(&output.stdout).unwrap()
}

/// The files kustomization.yaml lists, then the Secrets' layout.
fn manifest_files(environment: &Path) -> Vec<PathBuf> {
    let directory = kubernetes_directory();
    let kustomization = yaml_documents(environment, &directory.join("kustomization.yaml")).remove(0);
    let mut files: Vec<PathBuf> = kustomization["resources"]
        .as_array()
        .expect("kustomization.yaml lists resources")
        .iter()
        .map(|file| directory.join(file.as_str().expect("a file name")))
        .collect();
    files.push(directory.join(SECRETS_EXAMPLE));
    files
}

/// `kubernetes-validate --strict` of `files` against `version`: its complaints and
/// warnings, None when it has none.
fn schema_complaints(environment: &Path, version: &str, files: &[PathBuf]) -> Option<String> {
    let output = Command::new(environment.join("bin/kubernetes-validate"))
        .args(["--strict", "--quiet", "--kubernetes-version", version])
        .args(files)
        .output()
        .unwrap();
    let mut complaints = String::from_utf8_lossy(&output.stdout).into_owned();
    complaints.push_str(&String::from_utf8_lossy(&output.stderr));
    // A kind or apiVersion it has no schema for is only a warning, with exit code 0:
    // with --quiet, anything it prints counts.
    (!output.status.success() || !complaints.trim().is_empty())
        .then(|| format!("{}: {}", output.status, complaints.trim()))
}

#[test]
fn the_kubernetes_manifests_pass_the_schema_and_a_misspelt_one_does_not() {
    let Some(environment) = validator_or_skip() else { return };
    let files = manifest_files(&environment);
    for version in KUBERNETES_VERSIONS {
        let complaints = schema_complaints(&environment, version, &files);
        assert_eq!(complaints, None, "deploy/kubernetes/ against Kubernetes {version}");
    }

    // The check finds what it is for: a field the API does not know (strict), a value of
    // the wrong type, a resource kind the version does not have.
    let directory = tempfile::tempdir().unwrap();
    let text = std::fs::read_to_string(kubernetes_directory().join("statefulset.yaml")).unwrap();
    let broken_copies = [
        (text.replace("readinessProbe:", "readinesProbe:"), "readinesProbe"),
        (text.replace("replicas: 3", "replicas: three"), "three"),
        (text.replace("apiVersion: apps/v1", "apiVersion: apps/v1beta2"), "apps/v1beta2"),
    ];
    for (number, (broken, what)) in broken_copies.iter().enumerate() {
        assert_ne!(broken, &text, "the copy differs in {what}");
        let path = directory.path().join(format!("statefulset-{number}.yaml"));
        std::fs::write(&path, broken).unwrap();
        let complaints = schema_complaints(&environment, KUBERNETES_VERSIONS[1], &[path])
            .unwrap_or_else(|| panic!("a StatefulSet with {what} passed"));
        assert!(complaints.contains(what), "{complaints}");
    }
}

/// The manifests' resources, by kind and name.
struct Manifests {
    documents: Vec<Value>,
}

impl Manifests {
    fn read(environment: &Path) -> Manifests {
        let documents = manifest_files(environment).iter().flat_map(|file| yaml_documents(environment, file)).collect();
        Manifests { documents }
    }

    fn all(&self, kind: &str) -> Vec<&Value> {
        self.documents.iter().filter(|document| document["kind"] == kind).collect()
    }

    fn one(&self, kind: &str) -> &Value {
        let found = self.all(kind);
        assert_eq!(found.len(), 1, "one {kind}");
        found[0]
    }
}

/// The long flags `leasehold-server --help` lists.
fn server_flags() -> BTreeSet<String> {
    let output = Command::new(binary("leasehold-server")).arg("--help").output().unwrap();
    assert!(output.status.success());
    String::from_utf8(output.stdout)
        .unwrap()
        .lines()
        .flat_map(|line| line.trim().split(", ").map(str::to_owned).collect::<Vec<_>>())
        .filter_map(|word| word.strip_prefix("--").map(|flag| flag.split_whitespace().next().unwrap_or("").to_owned()))
        .collect()
}

/// The top-level keys of a flat TOML file: `key = ...` lines.
fn toml_keys(text: &str) -> Vec<String> {
    text.lines()
        .filter(|line| !line.starts_with([' ', '#', '"', ']']))
        .filter_map(|line| line.split_once('=').map(|(key, _)| key.trim().to_owned()))
        .filter(|key| !key.is_empty())
        .collect()
}

fn port_of(address: &str) -> i64 {
    address.rsplit_once(':').and_then(|(_, port)| port.parse().ok()).unwrap_or(-1)
}

/// What the manifests say that a schema cannot check: that the parts refer to each
/// other and to the server's flags correctly. Empty when they agree.
fn consistency_complaints(manifests: &Manifests, flags: &BTreeSet<String>) -> Vec<String> {
    let mut complaints = Vec::new();
    let mut expect = |holds: bool, what: String| {
        if !holds {
            complaints.push(what);
        }
    };
    let statefulset = manifests.one("StatefulSet");
    let name = statefulset["metadata"]["name"].as_str().unwrap_or("");
    let namespace = statefulset["metadata"]["namespace"].as_str().unwrap_or("");
    let spec = &statefulset["spec"];
    let replicas = spec["replicas"].as_i64().unwrap_or(0);
    let pod = &spec["template"]["spec"];
    let pod_labels = &spec["template"]["metadata"]["labels"];
    let service_name = spec["serviceName"].as_str().unwrap_or("");
    let services = manifests.all("Service");

    // Stable names: the serviceName is a headless Service that publishes pods before
    // they are ready, and the pods start together.
    let headless = services.iter().find(|service| service["metadata"]["name"] == service_name);
    expect(
        headless.is_some_and(|service| {
            service["spec"]["clusterIP"] == "None" && service["spec"]["publishNotReadyAddresses"] == true
        }),
        format!("serviceName {service_name:?} is not a headless Service with publishNotReadyAddresses: true"),
    );
    expect(spec["podManagementPolicy"] == "Parallel", "the pods do not start together (podManagementPolicy)".into());
    for service in &services {
        let selector = service["spec"]["selector"].as_object().cloned().unwrap_or_default();
        expect(
            !selector.is_empty() && selector.iter().all(|(key, value)| &pod_labels[key] == value),
            format!("Service {} does not select the pods", service["metadata"]["name"]),
        );
    }
    let budget = manifests.one("PodDisruptionBudget");
    expect(budget["spec"]["maxUnavailable"] == 1, "the disruption budget is not maxUnavailable: 1".into());
    expect(
        budget["spec"]["selector"]["matchLabels"] == spec["selector"]["matchLabels"],
        "the disruption budget does not select the pods".into(),
    );
    let anti_affinity = &pod["affinity"]["podAntiAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][0];
    expect(anti_affinity["topologyKey"] == "kubernetes.io/hostname", "no anti-affinity per Kubernetes node".into());
    expect(
        pod["terminationGracePeriodSeconds"].as_i64().is_some_and(|seconds| seconds > SHUTDOWN_WAIT_S),
        format!("terminationGracePeriodSeconds is not above the server's {SHUTDOWN_WAIT_S} s shutdown"),
    );
    expect(pod["securityContext"]["runAsNonRoot"] == true, "the pod may run as root".into());
    let containers: Vec<&Value> = ["initContainers", "containers"]
        .iter()
        .flat_map(|list| pod[list].as_array().map(|list| list.iter().collect::<Vec<_>>()).unwrap_or_default())
        .collect();
    for container in &containers {
        let security = &container["securityContext"];
        expect(
            security["readOnlyRootFilesystem"] == true
                && security["allowPrivilegeEscalation"] == false
                && security["capabilities"]["drop"] == serde_json::json!(["ALL"]),
            format!("container {} is not read-only, unprivileged, without capabilities", container["name"]),
        );
        expect(
            container["resources"]["requests"].is_object(),
            format!("container {} has no resource requests", container["name"]),
        );
    }

    // The configuration: it parses as the server parses it, and every key is a flag.
    let config_maps = manifests.all("ConfigMap");
    let config_map = config_maps.iter().find(|map| map["data"]["leasehold.toml"].is_string());
    let Some(config_map) = config_map else {
        complaints.push("no ConfigMap holds leasehold.toml".into());
        return complaints;
    };
    let toml_text = config_map["data"]["leasehold.toml"].as_str().unwrap();
    let file = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(file.path(), toml_text).unwrap();
    let raw = match RawConfig::from_toml_file(file.path()) {
        Ok(raw) => raw,
        Err(error) => {
            complaints.push(format!("leasehold.toml: {error}"));
            return complaints;
        }
    };
    for key in toml_keys(toml_text) {
        let flag = key.replace('_', "-");
        // A repeated flag's TOML key is its plural (--initial-member, initial_members).
        let known = flags.contains(&flag) || flag.strip_suffix('s').is_some_and(|one| flags.contains(one));
        expect(known, format!("leasehold.toml: {key} is not a flag that leasehold-server --help lists"));
    }
    expect(raw.node_id.is_none(), "leasehold.toml sets node_id: it is the pod's (start.sh)".into());
    expect(raw.probes_without_token, "the kubelet's probes send no token: probes_without_token = true".into());

    // The server's container: its ports, probes, mounts and the files the config names.
    let Some(server) = pod["containers"].as_array().and_then(|list| list.first()) else {
        complaints.push("the pod has no container".into());
        return complaints;
    };
    let container_port = |port: &Value| -> i64 {
        match port {
            Value::String(name) => server["ports"]
                .as_array()
                .and_then(|ports| ports.iter().find(|entry| entry["name"] == *name))
                .and_then(|entry| entry["containerPort"].as_i64())
                .unwrap_or(-1),
            other => other.as_i64().unwrap_or(-1),
        }
    };
    let metrics_port = port_of(raw.metrics_addr.as_deref().unwrap_or(""));
    for (probe, path) in [("startupProbe", "/livez"), ("livenessProbe", "/livez"), ("readinessProbe", "/readyz")] {
        let http = &server[probe]["httpGet"];
        expect(
            http["path"] == path && http["scheme"] == "HTTPS" && container_port(&http["port"]) == metrics_port,
            format!("{probe} is not HTTPS GET {path} on the metrics port {metrics_port} (metrics_addr)"),
        );
    }
    let mounts: Vec<(String, String)> = server["volumeMounts"]
        .as_array()
        .map(|mounts| {
            mounts
                .iter()
                .map(|mount| {
                    (mount["name"].as_str().unwrap_or("").into(), mount["mountPath"].as_str().unwrap_or("").into())
                })
                .collect()
        })
        .unwrap_or_default();
    let mounted =
        |path: &Path| mounts.iter().any(|(_, directory)| path.starts_with(directory) && path != Path::new(directory));
    let files = [
        ("data_dir", raw.data_dir.clone()),
        ("tls_cert", raw.tls_cert.clone()),
        ("tls_key", raw.tls_key.clone()),
        ("peer_cert", raw.peer_cert.clone()),
        ("peer_key", raw.peer_key.clone()),
        ("peer_ca", raw.peer_ca.clone()),
        ("admin_token_file", raw.admin_token_file.clone()),
        ("metrics_token_file", raw.metrics_token_file.clone()),
    ];
    for (key, path) in files {
        expect(
            path.as_deref().is_some_and(mounted),
            format!("{key} {path:?} is not inside a volume of the server's container"),
        );
    }
    let data_mount = mounts.iter().find(|(name, _)| name == "data").map(|(_, path)| path.clone()).unwrap_or_default();
    expect(
        raw.data_dir.as_deref().is_some_and(|data_dir| data_dir.starts_with(&data_mount)),
        format!("data_dir is not inside the pod's volume ({data_mount})"),
    );
    let claims: Vec<&str> = spec["volumeClaimTemplates"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|claim| claim["metadata"]["name"].as_str())
        .collect();
    expect(claims == ["data"], "one volume claim, data, per pod".into());

    // The initial members are the pods' stable names, in ordinal order, on the ports
    // the container and the headless Service expose.
    let client_port = container_port(&Value::String("client".into()));
    let peer_port = container_port(&Value::String("peer".into()));
    let expected_members: Vec<String> = (0..replicas)
        .map(|ordinal| {
            let host = format!("{name}-{ordinal}.{service_name}.{namespace}.{CLUSTER_DOMAIN}");
            format!("{}={host}:{client_port},{host}:{peer_port}", ordinal + 1)
        })
        .collect();
    expect(
        raw.initial_members == expected_members,
        format!("initial_members {:?} are not the pods' names {expected_members:?}", raw.initial_members),
    );
    if let Some(headless) = headless {
        let service_ports: Vec<i64> = headless["spec"]["ports"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|port| port["port"].as_i64())
            .collect();
        for port in [client_port, peer_port, metrics_port] {
            expect(service_ports.contains(&port), format!("the headless Service does not expose port {port}"));
        }
    }
    let endpoints = server["env"]
        .as_array()
        .and_then(|env| env.iter().find(|variable| variable["name"] == "LEASEHOLD_ENDPOINTS"))
        .and_then(|variable| variable["value"].as_str())
        .unwrap_or("");
    let client_addresses: Vec<String> = expected_members
        .iter()
        .filter_map(|member| member.split_once('=').and_then(|(_, addresses)| addresses.split_once(',')))
        .map(|(client, _)| client.to_owned())
        .collect();
    expect(
        endpoints == client_addresses.join(","),
        format!("LEASEHOLD_ENDPOINTS {endpoints:?} are not the client addresses"),
    );

    // Every node's Secret is mounted for the init container, which copies out its own.
    let secret_volumes: BTreeSet<&str> = pod["volumes"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|volume| volume["secret"]["secretName"].as_str())
        .collect();
    let secrets: BTreeSet<&str> =
        manifests.all("Secret").iter().filter_map(|secret| secret["metadata"]["name"].as_str()).collect();
    for node_id in 1..=replicas {
        let secret = format!("leasehold-node-{node_id}");
        expect(secret_volumes.contains(secret.as_str()), format!("the pod does not mount the Secret {secret}"));
    }
    expect(
        secret_volumes.is_subset(&secrets),
        format!("the pod mounts {secret_volumes:?}; the layout has {secrets:?}"),
    );
    complaints
}

#[test]
fn the_kubernetes_manifests_agree_with_each_other_and_the_server() {
    let Some(environment) = validator_or_skip() else { return };
    let flags = server_flags();
    assert!(flags.contains("probes-without-token") && flags.contains("initial-member"), "{flags:?}");
    let manifests = Manifests::read(&environment);
    assert_eq!(consistency_complaints(&manifests, &flags), Vec::<String>::new());

    // The check finds what it is for: each broken copy draws the complaint named.
    type Break = fn(&mut Value);
    let breaks: [(&str, &str, Break); 6] = [
        ("StatefulSet", "serviceName", |set| set["spec"]["serviceName"] = "leasehold".into()),
        ("StatefulSet", "readinessProbe", |set| {
            set["spec"]["template"]["spec"]["containers"][0]["readinessProbe"]["httpGet"]["path"] = "/livez".into()
        }),
        ("StatefulSet", "initial_members", |set| set["spec"]["replicas"] = 5.into()),
        ("ConfigMap", "metrics_addr", |map| {
            let text = map["data"]["leasehold.toml"].as_str().unwrap().replace(":7300\"", ":7301\"");
            map["data"]["leasehold.toml"] = text.into();
        }),
        ("ConfigMap", "metrics_adr", |map| {
            let text = map["data"]["leasehold.toml"].as_str().unwrap().replace("metrics_addr", "metrics_adr");
            map["data"]["leasehold.toml"] = text.into();
        }),
        ("StatefulSet", "read-only", |set| {
            set["spec"]["template"]["spec"]["containers"][0]["securityContext"]["readOnlyRootFilesystem"] = false.into()
        }),
    ];
    for (kind, complaint, break_it) in breaks {
        let mut broken = Manifests { documents: manifests.documents.clone() };
        let document = broken.documents.iter_mut().find(|document| document["kind"] == kind).unwrap();
        break_it(document);
        let complaints = consistency_complaints(&broken, &flags);
        assert!(complaints.iter().any(|text| text.contains(complaint)), "broken {complaint}: {complaints:?}");
    }
}

/// Runs the ConfigMap's start.sh with `arguments` as the pod `host`, with stand-ins for
/// `leasehold-server` (records its arguments) and `getent` (records the names asked).
/// Its exit code, the server's arguments and the names it resolved.
fn run_start_script(
    directory: &Path,
    host: &str,
    arguments: &[&str],
    variables: &[(&str, &Path)],
) -> (Option<i32>, Vec<String>, Vec<String>) {
    let stand_ins = directory.join("bin");
    std::fs::create_dir_all(&stand_ins).unwrap();
    let server_arguments = directory.join("server-arguments");
    let names = directory.join("names");
    let _ = std::fs::remove_file(&server_arguments);
    let _ = std::fs::remove_file(&names);
    for (program, body) in [
        ("leasehold-server", format!("printf '%s\\n' \"$@\" > {}", server_arguments.display())),
        ("getent", format!("echo \"$2\" >> {}", names.display())),
    ] {
        let path = stand_ins.join(program);
        std::fs::write(&path, format!("#!/bin/sh\n{body}\n")).unwrap();
        Command::new("chmod").arg("755").arg(&path).status().unwrap();
    }
    let path = format!("{}:{}", stand_ins.display(), std::env::var("PATH").unwrap_or_default());
    let mut command = Command::new("sh");
    command.arg(directory.join("start.sh")).args(arguments).env("HOSTNAME", host).env("PATH", path);
    for (name, value) in variables {
        command.env(name, value);
    }
    let output = command.output().unwrap();
    let read = |path: &Path| -> Vec<String> {
        std::fs::read_to_string(path).unwrap_or_default().lines().map(str::to_owned).collect()
    };
    (output.status.code(), read(&server_arguments), read(&names))
}

#[test]
fn the_start_script_runs_pod_n_as_node_n_plus_1() {
    let Some(environment) = validator_or_skip() else { return };
    let manifests = Manifests::read(&environment);
    let config_map = manifests.one("ConfigMap");
    let directory = tempfile::tempdir().unwrap();
    let directory = directory.path();
    for key in ["start.sh", "leasehold.toml"] {
        std::fs::write(directory.join(key), config_map["data"][key].as_str().unwrap()).unwrap();
    }
    let config = directory.join("leasehold.toml");
    let list = directory.join("new-incarnation");
    std::fs::write(&list, config_map["data"]["new-incarnation"].as_str().unwrap()).unwrap();
    let variables = [("LEASEHOLD_CONFIG", config.as_path()), ("LEASEHOLD_NEW_INCARNATION_LIST", list.as_path())];
    let flags = server_flags();

    let (code, arguments, names) = run_start_script(directory, "leasehold-2", &["server"], &variables);
    assert_eq!(code, Some(0));
    assert_eq!(arguments, ["--config", config.to_str().unwrap(), "--node-id", "3"]);
    let hosts: Vec<String> =
        (0..3).map(|ordinal| format!("leasehold-{ordinal}.leasehold-peers.leasehold.{CLUSTER_DOMAIN}")).collect();
    assert_eq!(names, hosts, "it waits until every initial member's name resolves");
    let (_, arguments, _) = run_start_script(directory, "leasehold-0", &["server"], &variables);
    assert_eq!(arguments[3], "1", "leasehold-0 is node 1");

    // A node listed for a new incarnation gets the flag while its data directory is
    // empty, and not once it holds data.
    std::fs::write(&list, "# node ids\n3\n").unwrap();
    let data_dir = directory.join("data");
    let text = std::fs::read_to_string(&config).unwrap();
    let moved = text.replace("\"/var/lib/leasehold/data\"", &format!("\"{}\"", data_dir.display()));
    assert_ne!(moved, text, "leasehold.toml's data_dir is /var/lib/leasehold/data");
    std::fs::write(&config, moved).unwrap();
    let (_, arguments, _) = run_start_script(directory, "leasehold-2", &["server"], &variables);
    assert_eq!(arguments.last().map(String::as_str), Some("--new-incarnation"));
    for argument in arguments.iter().filter_map(|argument| argument.strip_prefix("--")) {
        assert!(flags.contains(argument), "--{argument} is not a flag of leasehold-server");
    }
    let (_, arguments, _) = run_start_script(directory, "leasehold-1", &["server"], &variables);
    assert!(!arguments.contains(&"--new-incarnation".to_owned()), "node 2 is not listed");
    std::fs::create_dir_all(data_dir.join("db")).unwrap();
    let (_, arguments, _) = run_start_script(directory, "leasehold-2", &["server"], &variables);
    assert!(!arguments.contains(&"--new-incarnation".to_owned()), "its data directory holds data");

    // A host name without an ordinal is a configuration error, before the server starts.
    let (code, arguments, _) = run_start_script(directory, "leasehold", &["server"], &variables);
    assert_eq!((code, arguments.len()), (Some(2), 0));

    // The init container's half: this node's files only, and a missing one is named.
    let secrets = directory.join("nodes");
    let tls = directory.join("tls");
    std::fs::create_dir_all(&tls).unwrap();
    for node_id in 1..=3 {
        let node = secrets.join(format!("node-{node_id}"));
        std::fs::create_dir_all(&node).unwrap();
        for file in ["tls.crt", "tls.key", "ca.crt"] {
            std::fs::write(node.join(file), format!("node {node_id} {file}")).unwrap();
        }
    }
    let variables = [("LEASEHOLD_NODE_SECRETS", secrets.as_path()), ("LEASEHOLD_TLS_DIR", tls.as_path())];
    let (code, _, _) = run_start_script(directory, "leasehold-1", &["certificates"], &variables);
    assert_eq!(code, Some(0));
    assert_eq!(std::fs::read_to_string(tls.join("tls.key")).unwrap(), "node 2 tls.key");
    std::fs::remove_file(secrets.join("node-3/ca.crt")).unwrap();
    let (code, _, _) = run_start_script(directory, "leasehold-2", &["certificates"], &variables);
    assert_eq!(code, Some(2), "node 3's Secret lacks ca.crt");
}
