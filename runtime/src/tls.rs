//! The project's single TLS stack: rustls with the ring crypto provider, never OpenSSL or
//! aws-lc (DESIGN.md section 7). kube's client, reqwest (built with `rustls-no-provider`) and
//! the webhook's server all take the process-wide default provider, so every binary installs
//! ring once at start-up.

use std::sync::{Arc, Once};

use rustls::crypto::CryptoProvider;

/// The ring crypto provider, for configurations built with an explicit provider.
pub fn ring_provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// Install ring as the process-wide default provider. Only the first call does anything, and
/// a provider installed by someone else first is kept (both are ring in this workspace).
pub fn install_ring_provider() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        let _ = rustls::crypto::ring::default_provider().install_default();
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn installing_twice_leaves_ring_installed() {
        install_ring_provider();
        install_ring_provider();
        let installed = CryptoProvider::get_default().expect("a default provider");
        let ring = ring_provider();
        let names = |p: &CryptoProvider| {
            p.cipher_suites
                .iter()
                .map(|s| format!("{:?}", s.suite()))
                .collect::<Vec<_>>()
        };
        assert_eq!(names(installed), names(&ring));
    }
}
