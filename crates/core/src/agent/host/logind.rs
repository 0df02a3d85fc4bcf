//! The shutdown watcher: a systemd-logind *delay* inhibitor lock plus `PrepareForShutdown`.
//!
//! While the lock is held, logind delays a shutdown (an ACPI power-button press, which is how OCI
//! preemption arrives, or `systemctl poweroff`) by up to its `InhibitDelayMaxUSec` and announces it
//! with `PrepareForShutdown(true)`. The watcher then emits [`ShutdownSignal::ShuttingDown`] at once
//! and keeps the lock until the receiver says the report was delivered ([`Delivered::done`], or
//! dropping it) or the maximum delay passes, whichever comes first; then it releases the lock so
//! the shutdown proceeds. After `PrepareForShutdown(false)` (a cancelled shutdown) it takes the lock
//! again and emits [`ShutdownSignal::Cancelled`].

use std::time::{Duration, Instant};

use futures::StreamExt;
use tokio::sync::{mpsc, oneshot};
use zbus::{Connection, OwnedFd};

/// `org.freedesktop.login1.Manager`, the parts the watcher uses.
#[zbus::proxy(
    interface = "org.freedesktop.login1.Manager",
    default_service = "org.freedesktop.login1",
    default_path = "/org/freedesktop/login1"
)]
pub trait Login1Manager {
    /// Take an inhibitor lock; it lasts as long as the returned file descriptor is open.
    fn inhibit(&self, what: &str, who: &str, why: &str, mode: &str) -> zbus::Result<OwnedFd>;
    /// The current locks: (what, who, why, mode, uid, pid).
    fn list_inhibitors(&self) -> zbus::Result<Vec<(String, String, String, String, u32, u32)>>;
    /// `true` when a shutdown is about to happen, `false` when it was cancelled.
    #[zbus(signal)]
    fn prepare_for_shutdown(&self, start: bool) -> zbus::Result<()>;
    /// The longest a delay lock may hold up a shutdown, in µs.
    #[zbus(property(emits_changed_signal = "false"), name = "InhibitDelayMaxUSec")]
    fn inhibit_delay_max_usec(&self) -> zbus::Result<u64>;
}

/// Errors of the shutdown watcher; each names the logind method or the bus address.
#[derive(Debug, thiserror::Error)]
pub enum LogindError {
    /// The system bus could not be reached.
    #[error("cannot connect to the system D-Bus at {address}: {source}")]
    Connect {
        /// The bus address tried.
        address: String,
        /// The underlying zbus error.
        #[source]
        source: zbus::Error,
    },
    /// A call to systemd-logind failed (e.g. `Inhibit` refused).
    #[error("systemd-logind {method} failed: {source}")]
    Call {
        /// The D-Bus method, property or signal.
        method: &'static str,
        /// The underlying zbus error.
        #[source]
        source: zbus::Error,
    },
    /// The `PrepareForShutdown` signal stream ended (bus connection lost).
    #[error("the system D-Bus connection closed while watching systemd-logind PrepareForShutdown")]
    Closed,
}

/// What the watcher reports, in order.
#[derive(Debug)]
pub enum ShutdownSignal {
    /// The delay lock is held; a shutdown will wait up to `delay` for us.
    Inhibiting {
        /// The effective maximum delay: the configured one bounded by logind's.
        delay: Duration,
    },
    /// `PrepareForShutdown(true)`: the node is shutting down. The lock is held until `delivered`
    /// is signalled (or dropped) or `deadline` passes.
    ShuttingDown {
        /// When the lock will be released at the latest.
        deadline: Instant,
        /// Signal (or drop) once the shutdown report has been delivered.
        delivered: Delivered,
    },
    /// The lock was released; the shutdown proceeds.
    Released {
        /// True if released because the report was delivered, false on the deadline.
        delivered: bool,
    },
    /// `PrepareForShutdown(false)`: the shutdown was cancelled; the lock is taken again.
    Cancelled,
}

/// The receiver's acknowledgement that the shutdown report was delivered.
#[derive(Debug)]
pub struct Delivered(oneshot::Sender<()>);

impl Delivered {
    /// The report was delivered: release the lock now.
    pub fn done(self) {
        let _ = self.0.send(());
    }

    /// An acknowledgement and what it releases (tests).
    #[cfg(test)]
    pub(crate) fn pair() -> (Self, oneshot::Receiver<()>) {
        let (tx, rx) = oneshot::channel();
        (Delivered(tx), rx)
    }
}

/// Settings of the watcher.
#[derive(Debug, Clone)]
pub struct WatcherOptions {
    /// `who` of the lock, shown by `systemd-inhibit --list`.
    pub who: String,
    /// `why` of the lock.
    pub why: String,
    /// The longest the watcher holds up a shutdown (further bounded by `InhibitDelayMaxUSec`).
    pub max_delay: Duration,
}

impl Default for WatcherOptions {
    fn default() -> Self {
        Self {
            who: "nodekeeper".into(),
            why: "report the node shutdown to the controller".into(),
            max_delay: Duration::from_secs(5),
        }
    }
}

/// The shutdown watcher over one bus connection.
#[derive(Debug)]
pub struct ShutdownWatcher {
    conn: Connection,
    options: WatcherOptions,
}

impl ShutdownWatcher {
    /// A watcher on an existing connection to the system bus.
    pub fn new(conn: Connection, options: WatcherOptions) -> Self {
        Self { conn, options }
    }

    /// A watcher on the system bus at [`super::system_bus_address`].
    pub async fn connect_system(options: WatcherOptions) -> Result<Self, LogindError> {
        Self::connect_address(&super::system_bus_address(), options).await
    }

    /// A watcher on the bus at `addr`.
    pub async fn connect_address(addr: &str, options: WatcherOptions) -> Result<Self, LogindError> {
        let conn = zbus::connection::Builder::address(addr)
            .build()
            .await
            .map_err(|source| LogindError::Connect {
                address: addr.to_string(),
                source,
            })?;
        Ok(Self::new(conn, options))
    }

    /// Watch until the bus closes (an error) or `signals` is dropped (Ok). Dropping the returned
    /// future releases the lock.
    pub async fn run(self, signals: mpsc::Sender<ShutdownSignal>) -> Result<(), LogindError> {
        let manager = Login1ManagerProxy::new(&self.conn)
            .await
            .map_err(call("Login1Manager"))?;
        // Subscribe before taking the lock, so no PrepareForShutdown can slip between them.
        let mut prepare = manager
            .receive_prepare_for_shutdown()
            .await
            .map_err(call("AddMatch(PrepareForShutdown)"))?;
        let delay = effective_delay(
            self.options.max_delay,
            manager.inhibit_delay_max_usec().await,
        );
        let mut lock = Some(self.take_lock(&manager, delay, &signals).await?);
        while let Some(signal) = prepare.next().await {
            let start = signal.args().map_err(call("PrepareForShutdown"))?.start;
            if start {
                let delivered = hold_until_delivered(delay, &signals).await;
                lock = None;
                if signals
                    .send(ShutdownSignal::Released { delivered })
                    .await
                    .is_err()
                {
                    return Ok(());
                }
            } else {
                if lock.is_none() {
                    lock = Some(self.take_lock(&manager, delay, &signals).await?);
                }
                if signals.send(ShutdownSignal::Cancelled).await.is_err() {
                    return Ok(());
                }
            }
        }
        drop(lock);
        Err(LogindError::Closed)
    }

    async fn take_lock(
        &self,
        manager: &Login1ManagerProxy<'_>,
        delay: Duration,
        signals: &mpsc::Sender<ShutdownSignal>,
    ) -> Result<OwnedFd, LogindError> {
        let fd = manager
            .inhibit("shutdown", &self.options.who, &self.options.why, "delay")
            .await
            .map_err(call("Inhibit"))?;
        let _ = signals.send(ShutdownSignal::Inhibiting { delay }).await;
        Ok(fd)
    }
}

/// Emit `ShuttingDown` and wait for the delivery acknowledgement or `delay`; true if delivered.
async fn hold_until_delivered(delay: Duration, signals: &mpsc::Sender<ShutdownSignal>) -> bool {
    let deadline = Instant::now() + delay;
    let (tx, rx) = oneshot::channel();
    let event = ShutdownSignal::ShuttingDown {
        deadline,
        delivered: Delivered(tx),
    };
    let wait = async {
        if signals.send(event).await.is_err() {
            return false;
        }
        // A dropped acknowledgement counts as delivered: never hold a shutdown for nothing.
        let _ = rx.await;
        true
    };
    tokio::time::timeout_at(deadline.into(), wait)
        .await
        .unwrap_or(false)
}

/// The configured maximum delay, bounded by logind's `InhibitDelayMaxUSec` (when readable).
pub fn effective_delay(configured: Duration, logind_max_usec: zbus::Result<u64>) -> Duration {
    match logind_max_usec {
        Ok(usec) => configured.min(Duration::from_micros(usec)),
        Err(_) => configured,
    }
}

fn call(method: &'static str) -> impl FnOnce(zbus::Error) -> LogindError {
    move |source| LogindError::Call { method, source }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn delay_is_bounded_by_logind() {
        let five = Duration::from_secs(5);
        assert_eq!(
            effective_delay(Duration::from_secs(30), Ok(5_000_000)),
            five
        );
        assert_eq!(
            effective_delay(Duration::from_secs(2), Ok(5_000_000)),
            Duration::from_secs(2)
        );
        assert_eq!(effective_delay(five, Err(zbus::Error::InvalidReply)), five);
    }

    #[tokio::test]
    async fn hold_ends_on_delivery_or_deadline() {
        let (tx, mut rx) = mpsc::channel(4);
        let hold =
            tokio::spawn(async move { hold_until_delivered(Duration::from_secs(10), &tx).await });
        let Some(ShutdownSignal::ShuttingDown { delivered, .. }) = rx.recv().await else {
            panic!("no event")
        };
        delivered.done();
        assert!(hold.await.unwrap());

        let (tx, mut rx) = mpsc::channel(4);
        let started = Instant::now();
        let hold =
            tokio::spawn(
                async move { hold_until_delivered(Duration::from_millis(300), &tx).await },
            );
        let Some(ShutdownSignal::ShuttingDown {
            delivered: _keep, ..
        }) = rx.recv().await
        else {
            panic!("no event")
        };
        assert!(!hold.await.unwrap());
        let held = started.elapsed();
        assert!(
            held >= Duration::from_millis(300) && held < Duration::from_secs(3),
            "held {held:?}"
        );

        // A dropped acknowledgement releases at once.
        let (tx, mut rx) = mpsc::channel(4);
        let hold =
            tokio::spawn(async move { hold_until_delivered(Duration::from_secs(60), &tx).await });
        let Some(ShutdownSignal::ShuttingDown { delivered, .. }) = rx.recv().await else {
            panic!("no event")
        };
        drop(delivered);
        assert!(hold.await.unwrap());
    }
}
