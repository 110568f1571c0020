//! `make bench-grpc`: what mutual TLS between the services costs. One process serves the
//! standard gRPC health service on loopback, plain h2c and with mutual TLS (a throwaway CA and
//! certificate, loaded through `ClusterTls::load` as `kgmesh serve` loads them), and calls it
//! through kg_common's own servers and channels, the code every service hop runs: sequential
//! calls on a warm connection, calls with several in flight, and a new connection per call
//! (TCP plus, with TLS, the handshake). Three transports: h2c dialled by address (one plain
//! connection, as `kgmesh up` dials), h2c dialled by name (the balanced channel pods use), and
//! mTLS dialled by name (balanced, as every TLS channel is). They alternate in rounds, so drift
//! on the machine falls on all three. Prints p50/p95/p99/mean in microseconds and the ratios of
//! each to h2c by address.

// A benchmark reports on stdout.
#![allow(clippy::print_stdout)]

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use anyhow::Context as _;
use clap::Parser;
use kg_common::tls::{ClusterTls, TlsFiles};
use kgmesh::percentiles::Summary;
use rcgen::{BasicConstraints, CertificateParams, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair};
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use tonic::transport::Channel;
use tonic_health::pb::HealthCheckRequest;
use tonic_health::pb::health_client::HealthClient;

#[derive(Parser)]
#[command(about = "gRPC per-call cost of mutual TLS against plain h2c (loopback)")]
struct Args {
    /// Sequential calls per transport, on one warm connection.
    #[arg(long, default_value_t = 20_000)]
    calls: usize,
    /// Calls in flight at once for the concurrent run (as many calls again per transport).
    #[arg(long, default_value_t = 16)]
    in_flight: usize,
    /// New connections per transport, one call each.
    #[arg(long, default_value_t = 500)]
    connections: usize,
    /// Rounds the runs are split into, alternating the transports.
    #[arg(long, default_value_t = 10)]
    rounds: usize,
}

struct Target {
    name: &'static str,
    addr: String,
    tls: Option<ClusterTls>,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let rounds = args.rounds.max(1);
    let scratch = tempfile::tempdir().context("cannot create a scratch directory")?;
    let tls = ClusterTls::load(&write_certificates(scratch.path())?)?;
    let shutdown = CancellationToken::new();
    let plain = serve(None, shutdown.clone()).await?;
    let targets = [
        Target {
            name: "h2c, by address",
            addr: format!("http://{plain}"),
            tls: None,
        },
        Target {
            name: "h2c, by name",
            addr: format!("http://localhost:{}", plain.port()),
            tls: None,
        },
        Target {
            name: "mTLS, by name",
            // By name: the certificate is checked against it, as between pods.
            addr: format!(
                "https://localhost:{}",
                serve(Some(&tls), shutdown.clone()).await?.port()
            ),
            tls: Some(tls),
        },
    ];
    let count = targets.len();

    let mut sequential = vec![Vec::new(); count];
    let mut concurrent = vec![Vec::new(); count];
    let mut concurrent_wall = vec![Duration::ZERO; count];
    let mut connecting = vec![Vec::new(); count];
    let warm: Vec<HealthClient<Channel>> = targets
        .iter()
        .map(|target| channel(target).map(HealthClient::new))
        .collect::<anyhow::Result<_>>()?;
    // The first call connects (and handshakes): not part of the warm figures.
    for client in &warm {
        let mut client = client.clone();
        for _ in 0..100 {
            call(&mut client).await?;
        }
    }
    for round in 0..rounds {
        // Each round starts with the next transport.
        for index in (0..count).map(|offset| (round + offset) % count) {
            let mut client = warm[index].clone();
            for _ in 0..args.calls / rounds {
                sequential[index].push(call(&mut client).await?);
            }
            let started = Instant::now();
            let mut tasks = tokio::task::JoinSet::new();
            for _ in 0..args.in_flight.max(1) {
                let mut client = warm[index].clone();
                let each = args.calls / rounds / args.in_flight.max(1);
                tasks.spawn(async move {
                    let mut took = Vec::with_capacity(each);
                    for _ in 0..each {
                        took.push(call(&mut client).await?);
                    }
                    anyhow::Ok(took)
                });
            }
            while let Some(joined) = tasks.join_next().await {
                concurrent[index].extend(joined??);
            }
            concurrent_wall[index] += started.elapsed();
            for _ in 0..args.connections / rounds {
                let started = Instant::now();
                let mut client = HealthClient::new(channel(&targets[index])?);
                call(&mut client).await?;
                connecting[index].push(started.elapsed());
            }
        }
    }
    shutdown.cancel();

    println!(
        "gRPC health check over loopback through kg_common's servers and channels, plain h2c \
         against mutual TLS (rustls, ring; ECDSA P-256 certificates); {rounds} alternating rounds; \
         microseconds"
    );
    println!(
        "{:<46} {:>7} {:>9} {:>9} {:>9} {:>9}",
        "run", "n", "p50", "p95", "p99", "mean"
    );
    let runs = [
        ("sequential, warm connection", &sequential),
        ("concurrent, warm connection", &concurrent),
        ("new connection per call", &connecting),
    ];
    let mut ratios = Vec::new();
    for (name, samples) in runs {
        let summaries: Vec<Summary> = samples.iter().map(|taken| summary(taken)).collect();
        for (index, target) in targets.iter().enumerate() {
            let summary = &summaries[index];
            println!(
                "{:<46} {:>7} {:>9.1} {:>9.1} {:>9.1} {:>9.1}",
                format!("{name} ({})", target.name),
                samples[index].len(),
                summary.p50,
                summary.p95,
                summary.p99,
                summary.mean
            );
        }
        for (index, target) in targets.iter().enumerate().skip(1) {
            ratios.push(format!(
                "{name}, {}: p50 x{:.2} ({:+.1} us), p99 x{:.2}",
                target.name,
                summaries[index].p50 / summaries[0].p50,
                summaries[index].p50 - summaries[0].p50,
                summaries[index].p99 / summaries[0].p99
            ));
        }
    }
    for (index, target) in targets.iter().enumerate() {
        let calls = concurrent[index].len() as f64;
        println!(
            "throughput with {} in flight ({}): {:.0} calls/s",
            args.in_flight,
            target.name,
            calls / concurrent_wall[index].as_secs_f64()
        );
    }
    println!("against {}:", targets[0].name);
    for line in ratios {
        println!("  {line}");
    }
    Ok(())
}

fn channel(target: &Target) -> anyhow::Result<Channel> {
    kg_common::grpc::channel_for(&target.addr, target.tls.as_ref())
        .with_context(|| format!("bad address {}", target.addr))
}

async fn call(client: &mut HealthClient<Channel>) -> anyhow::Result<Duration> {
    let started = Instant::now();
    client
        .check(HealthCheckRequest {
            service: String::new(),
        })
        .await
        .context("health check failed")?;
    Ok(started.elapsed())
}

async fn serve(
    tls: Option<&ClusterTls>,
    shutdown: CancellationToken,
) -> anyhow::Result<SocketAddr> {
    let listener = TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    let (_reporter, health) = tonic_health::server::health_reporter();
    let connections = kg_common::grpc::incoming_for(listener, tls, &shutdown);
    tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(health)
            .serve_with_incoming_shutdown(connections, shutdown.cancelled_owned()),
    );
    Ok(addr)
}

/// A CA and one service certificate for localhost, as a cluster's would be.
fn write_certificates(dir: &std::path::Path) -> anyhow::Result<TlsFiles> {
    let ca_key = KeyPair::generate()?;
    let mut ca_params = CertificateParams::new(Vec::<String>::new())?;
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    let ca_pem = ca_params.self_signed(&ca_key)?.pem();
    let issuer = Issuer::new(ca_params, ca_key);
    let key = KeyPair::generate()?;
    let mut params = CertificateParams::new(vec!["localhost".to_owned()])?;
    params.extended_key_usages = vec![
        ExtendedKeyUsagePurpose::ServerAuth,
        ExtendedKeyUsagePurpose::ClientAuth,
    ];
    let cert = params.signed_by(&key, &issuer)?;
    let files = TlsFiles {
        ca_file: dir.join("ca.crt"),
        cert_file: dir.join("tls.crt"),
        key_file: dir.join("tls.key"),
    };
    std::fs::write(&files.ca_file, ca_pem)?;
    std::fs::write(&files.cert_file, cert.pem())?;
    std::fs::write(&files.key_file, key.serialize_pem())?;
    Ok(files)
}

/// Nearest-rank percentiles of `samples`, in microseconds.
fn summary(samples: &[Duration]) -> Summary {
    Summary::of(samples.iter().map(|d| d.as_secs_f64() * 1e6).collect())
}
