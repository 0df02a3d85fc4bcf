//! After the pods: wait until no VolumeAttachment names the node.

use kube::api::ListParams;
use tokio::time::Instant;

use super::evict::retriable;
use super::Drainer;
use crate::controller::drain::{BlockReason, Blocker, DrainError, DrainProgress, Phase};

impl<F: FnMut(&DrainProgress) + Send> Drainer<'_, F> {
    /// Waits until no VolumeAttachment names the node (bounded by the deadline).
    pub(super) async fn wait_volumes(&mut self) -> Result<(), DrainError> {
        loop {
            let left: Vec<String> = match self.volumes.list(&ListParams::default()).await {
                Ok(l) => l
                    .items
                    .into_iter()
                    .filter(|v| v.spec.node_name == self.opts.node)
                    .filter_map(|v| v.metadata.name)
                    .collect(),
                Err(e) if retriable(&e) => vec![],
                Err(e) => return Err(self.api_err("list volumeattachments", e)),
            };
            let Some(first) = left.first() else {
                return Ok(());
            };
            let b = Blocker {
                pod: first.clone(),
                pdb: None,
                reason: BlockReason::VolumeAttachment,
                message: format!("{} VolumeAttachment(s) still attached", left.len()),
            };
            self.emit(Phase::WaitingVolumes, None, 0, 0, Some(b.clone()));
            self.check_deadline(Some(b), 0)?;
            self.sleep(self.next_wake(Instant::now())).await?;
        }
    }
}
