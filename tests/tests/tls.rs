//! https:// webhook targets: verified against the compiled-in roots plus `--tls-ca-file`,
//! refused with a clear error when the certificate is not trusted. The target is a real
//! TLS server (rustls) with a certificate issued by a test CA made here.

use std::convert::Infallible;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::{Request, Response};
use hyper_util::rt::TokioIo;
use kairos_e2e::*;
use rcgen::{BasicConstraints, CertificateParams, CertifiedIssuer, DnType, IsCa, KeyPair};
use serde_json::json;

/// (method, path, body) of each request the TLS sink received.
type Log = Arc<Mutex<Vec<(String, String, Vec<u8>)>>>;

/// A test CA (PEM) and a certificate plus key for `localhost` issued by it.
fn certificates() -> (String, Vec<u8>, Vec<u8>) {
    let mut ca_params = CertificateParams::new(Vec::<String>::new()).unwrap();
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca_params
        .distinguished_name
        .push(DnType::CommonName, "kairos test CA");
    let ca = CertifiedIssuer::self_signed(ca_params, KeyPair::generate().unwrap()).unwrap();
    let leaf_key = KeyPair::generate().unwrap();
    let leaf = CertificateParams::new(vec!["localhost".to_string()])
        .unwrap()
        .signed_by(&leaf_key, &ca)
        .unwrap();
    let ca_pem = AsRef::<rcgen::Certificate>::as_ref(&ca).pem();
    (ca_pem, leaf.der().to_vec(), leaf_key.serialize_der())
}

/// Serves HTTPS on 127.0.0.1 with `cert`/`key`, answering 200 and logging requests.
async fn tls_sink(cert: Vec<u8>, key: Vec<u8>) -> (u16, Log) {
    let config = rustls::ServerConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .unwrap()
    .with_no_client_auth()
    .with_single_cert(
        vec![cert.into()],
        rustls::pki_types::PrivateKeyDer::Pkcs8(key.into()),
    )
    .unwrap();
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let log: Log = Arc::default();
    let log2 = log.clone();
    tokio::spawn(async move {
        loop {
            let Ok((tcp, _)) = listener.accept().await else {
                return;
            };
            let (acceptor, log) = (acceptor.clone(), log2.clone());
            tokio::spawn(async move {
                let Ok(tls) = acceptor.accept(tcp).await else {
                    return;
                };
                let service = hyper::service::service_fn(move |req: Request<Incoming>| {
                    let log = log.clone();
                    async move {
                        let (method, path) =
                            (req.method().to_string(), req.uri().path().to_string());
                        let body = req
                            .into_body()
                            .collect()
                            .await
                            .map(|b| b.to_bytes().to_vec())
                            .unwrap_or_default();
                        log.lock().unwrap().push((method, path, body));
                        Ok::<_, Infallible>(Response::new(Full::new(Bytes::from_static(b"ok"))))
                    }
                });
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(tls), service)
                    .await;
            });
        }
    });
    (port, log)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn https_targets_are_verified_and_called() {
    let (ca_pem, cert, key) = certificates();
    let dir = TempDir::new("tls");
    let ca_file = dir.0.join("ca.pem");
    std::fs::write(&ca_file, &ca_pem).unwrap();
    let (port, log) = tls_sink(cert, key).await;
    let redis = RedisServer::start();
    let sink = Sink::start().await;

    // Trusting the test CA: the call goes through TLS and arrives whole.
    let trusting = Host::start(
        &redis.url(),
        &flags(
            &sink,
            &[
                ("--tls-ca-file", ca_file.to_str().unwrap()),
                ("--allowed-hosts", "localhost"),
            ],
        ),
    );
    let api = Api::new(&trusting);
    let url = format!("https://localhost:{port}/secure");
    let action = json!({"url": url, "method": "POST", "body": {"over": "tls"}});
    book(&api, &point("tls-ok", now_ms() + 1_000, action.clone())).await;
    let life = api
        .wait_life("tls-ok", Duration::from_secs(10), |l| state(l) == "Dead")
        .await;
    assert_eq!(plan(&life, "birth")["last_status"], 200, "{life:#}");
    let got = log.lock().unwrap().clone();
    assert_eq!(got.len(), 1);
    assert_eq!((got[0].0.as_str(), got[0].1.as_str()), ("POST", "/secure"));
    assert_eq!(got[0].2, br#"{"over":"tls"}"#.to_vec());

    // Not trusting it: the call fails with a certificate error and the target sees nothing.
    let wary = Host::start(
        &redis.url(),
        &flags(
            &sink,
            &[("--allowed-hosts", "localhost"), ("--key-prefix", "wary")],
        ),
    );
    let api = Api::new(&wary);
    book(&api, &point("tls-untrusted", now_ms() + 1_000, action)).await;
    let life = api
        .wait_life("tls-untrusted", Duration::from_secs(10), |l| {
            state(l) == "Stillbirth"
        })
        .await;
    let error = history(&life)[0]["error"]
        .as_str()
        .unwrap_or("")
        .to_string();
    assert!(error.to_lowercase().contains("certificate"), "{error}");
    assert_eq!(
        log.lock().unwrap().len(),
        1,
        "the untrusted call must not complete a request"
    );

    // A CA file that is not PEM stops the host at start with a message naming it.
    let bad = dir.0.join("bad.pem");
    std::fs::write(&bad, "not a certificate").unwrap();
    let out = std::process::Command::new(kairos_bin())
        .args([
            "serve",
            "--redis-url",
            &redis.url(),
            "--listen",
            "127.0.0.1:0",
            "--tls-ca-file",
            bad.to_str().unwrap(),
        ])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("tls_ca_file"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}
