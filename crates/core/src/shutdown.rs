//! The one shutdown token. The binary edge calls [`install`] once: SIGTERM or SIGINT cancels the
//! root [`CancellationToken`] (a graceful stop; a second signal exits at once with code 130), and
//! SIGHUP asks for a configuration reload. Every long-running part takes a token: the root, or a
//! [`CancellationToken::child_token`] of it when it must also be stoppable on its own (the agent's
//! producers on a reload, one controller in a test), so cancelling the root stops the whole tree.

use tokio::signal::unix::{signal, SignalKind};
use tokio::sync::mpsc;
pub use tokio_util::sync::CancellationToken;

/// Signal-driven control inputs of a long-running command.
#[derive(Debug)]
pub struct Signals {
    /// The root token: cancelled on the first SIGTERM or SIGINT.
    pub shutdown: CancellationToken,
    /// Receives one message per SIGHUP.
    pub reload: mpsc::Receiver<()>,
}

/// The exit code of a process stopped by a second SIGTERM/SIGINT (128 + SIGINT, as shells report).
pub const SECOND_SIGNAL_EXIT: i32 = 130;

/// Installs the handlers. A second SIGTERM/SIGINT exits the process at once with
/// [`SECOND_SIGNAL_EXIT`].
pub fn install() -> std::io::Result<Signals> {
    let mut term = signal(SignalKind::terminate())?;
    let mut int = signal(SignalKind::interrupt())?;
    let mut hup = signal(SignalKind::hangup())?;
    let root = CancellationToken::new();
    let (reload_tx, reload_rx) = mpsc::channel(4);
    let cancel = root.clone();
    tokio::spawn(async move {
        loop {
            tokio::select! {
                _ = term.recv() => {}
                _ = int.recv() => {}
            }
            if cancel.is_cancelled() {
                tracing::warn!("second termination signal: exiting now");
                std::process::exit(SECOND_SIGNAL_EXIT);
            }
            tracing::info!("termination signal received: shutting down gracefully");
            cancel.cancel();
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
        shutdown: root,
        reload: reload_rx,
    })
}
