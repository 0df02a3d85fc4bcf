use super::due::wake_after;
use super::*;

/// A clock on tokio's (paused) time, running `speed` times faster than real time.
pub(super) struct Paused {
    pub(super) base: DateTime<Utc>,
    pub(super) t0: tokio::time::Instant,
    pub(super) speed: u32,
}

impl Clock for Paused {
    fn now(&self) -> DateTime<Utc> {
        let elapsed = self.t0.elapsed() * self.speed;
        self.base + chrono::Duration::from_std(elapsed).unwrap_or_default()
    }
    fn real(&self, d: Duration) -> Duration {
        d / self.speed
    }
}

fn clock(speed: u32) -> Paused {
    Paused {
        base: DateTime::from_timestamp(1_700_000_000, 0).unwrap_or_default(),
        t0: tokio::time::Instant::now(),
        speed,
    }
}

/// The run loop's toleration timer: sleeping [`wake_after`] wakes 5 ms of real time after
/// the expiry (so the reconcile then sees `now > due` and starts the repair), not a tick
/// later and not before; on a faster clock the wait is scaled down.
#[tokio::test(start_paused = true)]
async fn the_engine_wakes_just_after_the_toleration_expires() {
    for speed in [1u32, 10] {
        let c = clock(speed);
        let due = c.now() + chrono::Duration::seconds(300);
        let wait = wake_after(&c, due);
        assert_eq!(
            wait,
            Duration::from_secs(300) / speed + Duration::from_millis(5)
        );
        tokio::time::sleep_until(c.t0 + Duration::from_secs(299) / speed).await;
        assert!(c.now() < due, "one second before: not due");
        tokio::time::sleep_until(c.t0 + wait).await;
        let late = c.now() - due;
        assert!(late > chrono::Duration::zero(), "speed {speed}: {late:?}");
        assert_eq!(
            late,
            chrono::Duration::milliseconds(5 * i64::from(speed)),
            "speed {speed}"
        );
    }
    let c = clock(1);
    let past = c.now() - chrono::Duration::seconds(10);
    assert_eq!(
        wake_after(&c, past),
        Duration::from_millis(5),
        "past: at once"
    );
}
