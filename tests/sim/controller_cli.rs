//! `nodekeeper controller` through the real binary: validate redacts the OCI secret; the
//! controller serves, takes the Lease, and releases it on SIGTERM.

use crate::support::ctl;

use std::time::Duration;

use ctl::*;
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;

fn config_text(env: &Env, port: u16) -> String {
    format!(
        "[controller]\nlisten = \"127.0.0.1:{port}\"\ntls_cert_file = {:?}\ntls_key_file = {:?}\n\
         service_account = \"{SA}\"\n[controller.leader]\nidentity = \"cli\"\nlease_duration = \"2s\"\nretry_period = \"200ms\"\n\
         [controller.oci_events]\nenabled = true\ntoken = \"a-very-secret-oci-token\"\n",
        env.cert, env.key
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn binary_serves_leads_and_releases_on_sigterm() {
    let env = Env::new(1).await;
    // Port 0: the controller picks its port and logs it (`controller listening`, field `addr`).
    let cfg = env.dir.path().join("controller.toml");
    std::fs::write(&cfg, config_text(&env, 0)).unwrap();
    let kubeconfig = env.dir.path().join("kubeconfig");
    env.cluster.write_kubeconfig(&kubeconfig).unwrap();

    let out = std::process::Command::new(env!("CARGO_BIN_EXE_nodekeeper"))
        .args(["validate", "--config"])
        .arg(&cfg)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        !text.contains("a-very-secret-oci-token")
            && text.contains(nodekeeper_core::config::REDACTED),
        "{text}"
    );

    let log = env.dir.path().join("controller.log");
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_nodekeeper"))
        .args(["controller", "--config"])
        .arg(&cfg)
        .env("KUBECONFIG", &kubeconfig)
        .env("NODEKEEPER_LOG_FORMAT", "json")
        .stdout(std::process::Stdio::null())
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .unwrap();
    let http = https(&env.ca, "127.0.0.1:1".parse().unwrap());
    let addr = crate::support::controller_addr(&log).await;
    assert!(addr.ip().is_loopback() && addr.port() != 0, "{addr}");
    let leases: kube::Api<k8s_openapi::api::coordination::v1::Lease> =
        kube::Api::namespaced(env.cluster.client.clone(), "nodekeeper");
    let deadline = tokio::time::Instant::now() + Duration::from_secs(15);
    loop {
        let ready = matches!(get(&http, addr, "/readyz").await, Ok((200, _)));
        let holder = leases
            .get_opt("nodekeeper-controller")
            .await
            .unwrap()
            .and_then(|l| l.spec?.holder_identity);
        if ready && holder.as_deref() == Some("cli") {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "controller never became ready and leader"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let t0 = env.token("n0", "nodekeeper").await;
    let r = report(
        "n0",
        1,
        &[(
            "NodekeeperDiskPressure",
            nodekeeper_core::agent::checks::ConditionStatus::True,
        )],
    );
    assert_eq!(
        post(&http, addr, Some(&t0), &serde_json::to_value(&r).unwrap())
            .await
            .0,
        200
    );
    assert_eq!(
        conditions(&env.nodes(), "n0").await["NodekeeperDiskPressure"].0,
        "True"
    );

    kill(Pid::from_raw(child.id() as i32), Signal::SIGTERM).unwrap();
    let status = tokio::task::spawn_blocking(move || child.wait().unwrap())
        .await
        .unwrap();
    assert!(status.success(), "{status:?}");
    let lease = leases.get("nodekeeper-controller").await.unwrap();
    assert_eq!(
        lease.spec.unwrap().holder_identity,
        None,
        "lease released on SIGTERM"
    );
}
