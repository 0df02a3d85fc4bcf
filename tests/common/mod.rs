//! Helpers shared by the integration tests.
#![allow(dead_code)]

pub mod nspawn;
pub mod package_boot;
