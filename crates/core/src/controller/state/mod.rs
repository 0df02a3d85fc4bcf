//! What the controller knows of each node: the conditions and staleness of the agents' reports
//! ([`nodestate`]) and what one node's reports may ask ([`limits`]), label removal on an agent's
//! request ([`labels`]), the newest copy of each Node our own writes returned ([`fresh`]) and the
//! NodePool cache ([`nodepools`]).

pub mod fresh;
pub mod labels;
pub mod limits;
pub mod nodepools;
pub mod nodestate;
