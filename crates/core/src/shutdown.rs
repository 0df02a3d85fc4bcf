//! Process signals: SIGTERM/SIGINT ask for a graceful stop (a second one aborts), SIGHUP asks
//! for a configuration reload.

use tokio::signal::unix::{signal, SignalKind};
use tokio::sync::{mpsc, watch};

/// Signal-driven control inputs of a long-running command.
pub struct Signals {
    /// Becomes `true` on the first SIGTERM or SIGINT.
    pub shutdown: watch::Receiver<bool>,
    /// Receives one message per SIGHUP.
    pub reload: mpsc::Receiver<()>,
}

/// Installs the handlers. A second SIGTERM/SIGINT exits the process at once with code 130.
pub fn install() -> std::io::Result<Signals> {
    let mut term = signal(SignalKind::terminate())?;
    let mut int = signal(SignalKind::interrupt())?;
    let mut hup = signal(SignalKind::hangup())?;
    let (stop_tx, stop_rx) = watch::channel(false);
    let (reload_tx, reload_rx) = mpsc::channel(4);
    tokio::spawn(async move {
        let mut seen = false;
        loop {
            tokio::select! {
                _ = term.recv() => {}
                _ = int.recv() => {}
            }
            if seen {
                tracing::warn!("second termination signal: exiting now");
                std::process::exit(130);
            }
            seen = true;
            tracing::info!("termination signal received: shutting down gracefully");
            let _ = stop_tx.send(true);
        }
    });
    tokio::spawn(async move {
        while hup.recv().await.is_some() {
            if reload_tx.try_send(()).is_err() {
                tracing::debug!("reload already pending");
            }
        }
    });
    Ok(Signals {
        shutdown: stop_rx,
        reload: reload_rx,
    })
}
