//! A small keep-alive HTTPS client (HTTP/1.1 over tokio-rustls, ring provider) for the load
//! generator and the tests: one TLS connection, requests one after another on it.

use std::net::SocketAddr;
use std::sync::Arc;

use http_body_util::{BodyExt, Full};
use hyper::body::Bytes;
use hyper::client::conn::http1::SendRequest;
use hyper_util::rt::TokioIo;
use rustls::pki_types::{CertificateDer, ServerName};
use tokio::net::TcpStream;
use tokio_rustls::TlsConnector;

use primus_runtime::tls::ring_provider as provider;

/// Errors of the client.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    #[error("CA certificate: {0}")]
    Ca(String),
    #[error("TLS: {0}")]
    Tls(#[from] rustls::Error),
    #[error("{0}")]
    Io(#[from] std::io::Error),
    #[error("HTTP: {0}")]
    Http(#[from] hyper::Error),
    #[error("request: {0}")]
    Request(#[from] hyper::http::Error),
    #[error("server name {0:?} is not a DNS name or IP address")]
    ServerName(String),
}

/// A rustls client configuration that trusts only `ca_pem` (HTTP/1.1 ALPN).
pub fn client_config(ca_pem: &[u8]) -> Result<Arc<rustls::ClientConfig>, ClientError> {
    let certs: Vec<CertificateDer<'static>> = rustls_pemfile::certs(&mut &ca_pem[..])
        .collect::<Result<_, _>>()
        .map_err(|e| ClientError::Ca(e.to_string()))?;
    if certs.is_empty() {
        return Err(ClientError::Ca("no PEM certificate found".into()));
    }
    let mut roots = rustls::RootCertStore::empty();
    for c in certs {
        roots.add(c).map_err(|e| ClientError::Ca(e.to_string()))?;
    }
    let mut config = rustls::ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()?
        .with_root_certificates(roots)
        .with_no_client_auth();
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(Arc::new(config))
}

/// One keep-alive HTTPS connection.
pub struct Connection {
    sender: SendRequest<Full<Bytes>>,
    host: String,
}

/// The answer to one request.
#[derive(Debug, Clone)]
pub struct Answer {
    pub status: u16,
    pub body: Bytes,
    pub warning_headers: Vec<String>,
}

impl Connection {
    /// Connect to `addr` and verify the server as `server_name`.
    pub async fn open(
        addr: SocketAddr,
        server_name: &str,
        config: Arc<rustls::ClientConfig>,
    ) -> Result<Connection, ClientError> {
        let name = ServerName::try_from(server_name.to_string())
            .map_err(|_| ClientError::ServerName(server_name.to_string()))?;
        let tcp = TcpStream::connect(addr).await?;
        tcp.set_nodelay(true)?;
        let tls = TlsConnector::from(config).connect(name, tcp).await?;
        let (sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tls)).await?;
        tokio::spawn(async move {
            let _ = conn.await;
        });
        Ok(Connection {
            sender,
            host: format!("{server_name}:{}", addr.port()),
        })
    }

    /// Whether the connection can take another request.
    pub fn is_open(&self) -> bool {
        !self.sender.is_closed()
    }

    /// Send one request and read the whole answer.
    pub async fn request(
        &mut self,
        method: &str,
        path: &str,
        body: Option<Bytes>,
    ) -> Result<Answer, ClientError> {
        self.sender.ready().await?;
        let mut req = hyper::Request::builder()
            .method(method)
            .uri(path)
            .header("host", &self.host);
        if body.is_some() {
            req = req.header("content-type", "application/json");
        }
        let req = req.body(Full::new(body.unwrap_or_default()))?;
        let resp = self.sender.send_request(req).await?;
        let status = resp.status().as_u16();
        let warning_headers = resp
            .headers()
            .get_all("warning")
            .iter()
            .filter_map(|v| v.to_str().ok().map(str::to_string))
            .collect();
        let body = resp.into_body().collect().await?.to_bytes();
        Ok(Answer {
            status,
            body,
            warning_headers,
        })
    }

    /// POST a JSON body.
    pub async fn post(&mut self, path: &str, body: Bytes) -> Result<Answer, ClientError> {
        self.request("POST", path, Some(body)).await
    }

    /// GET a path.
    pub async fn get(&mut self, path: &str) -> Result<Answer, ClientError> {
        self.request("GET", path, None).await
    }
}
