//! What a wrapper around an accepted stream (`preface.rs`, `head_count.rs`) does not change, it
//! forwards to the stream it wraps: writes, shutdown, and the digests Pingora reads of the
//! connection (TLS, timing, proxy, socket). One macro, so the wrappers cannot drift apart.

/// Implements `AsyncWrite`, `Shutdown`, `UniqueID`, `Ssl`, `GetTimingDigest`, `GetProxyDigest`
/// and `GetSocketDigest` for `$wrapper` by forwarding to its field `inner: Stream`.
macro_rules! forward_to_inner {
    ($wrapper:ty) => {
        impl tokio::io::AsyncWrite for $wrapper {
            fn poll_write(
                mut self: std::pin::Pin<&mut Self>,
                cx: &mut std::task::Context<'_>,
                buf: &[u8],
            ) -> std::task::Poll<std::io::Result<usize>> {
                std::pin::Pin::new(&mut self.inner).poll_write(cx, buf)
            }

            fn poll_flush(
                mut self: std::pin::Pin<&mut Self>,
                cx: &mut std::task::Context<'_>,
            ) -> std::task::Poll<std::io::Result<()>> {
                std::pin::Pin::new(&mut self.inner).poll_flush(cx)
            }

            fn poll_shutdown(
                mut self: std::pin::Pin<&mut Self>,
                cx: &mut std::task::Context<'_>,
            ) -> std::task::Poll<std::io::Result<()>> {
                std::pin::Pin::new(&mut self.inner).poll_shutdown(cx)
            }

            fn poll_write_vectored(
                mut self: std::pin::Pin<&mut Self>,
                cx: &mut std::task::Context<'_>,
                bufs: &[std::io::IoSlice<'_>],
            ) -> std::task::Poll<std::io::Result<usize>> {
                std::pin::Pin::new(&mut self.inner).poll_write_vectored(cx, bufs)
            }

            fn is_write_vectored(&self) -> bool {
                self.inner.is_write_vectored()
            }
        }

        #[async_trait::async_trait]
        impl pingora::protocols::Shutdown for $wrapper {
            async fn shutdown(&mut self) {
                self.inner.shutdown().await
            }
        }

        impl pingora::protocols::UniqueID for $wrapper {
            fn id(&self) -> pingora::protocols::UniqueIDType {
                self.inner.id()
            }
        }

        impl pingora::protocols::Ssl for $wrapper {
            fn get_ssl(&self) -> Option<&pingora::protocols::tls::TlsRef> {
                self.inner.get_ssl()
            }

            fn get_ssl_digest(&self) -> Option<std::sync::Arc<pingora::protocols::tls::SslDigest>> {
                self.inner.get_ssl_digest()
            }

            fn selected_alpn_proto(&self) -> Option<pingora::protocols::ALPN> {
                self.inner.selected_alpn_proto()
            }
        }

        impl pingora::protocols::GetTimingDigest for $wrapper {
            fn get_timing_digest(&self) -> Vec<Option<pingora::protocols::TimingDigest>> {
                self.inner.get_timing_digest()
            }

            fn get_read_pending_time(&self) -> std::time::Duration {
                self.inner.get_read_pending_time()
            }

            fn get_write_pending_time(&self) -> std::time::Duration {
                self.inner.get_write_pending_time()
            }
        }

        impl pingora::protocols::GetProxyDigest for $wrapper {
            fn get_proxy_digest(
                &self,
            ) -> Option<std::sync::Arc<pingora::protocols::raw_connect::ProxyDigest>> {
                self.inner.get_proxy_digest()
            }

            fn set_proxy_digest(&mut self, digest: pingora::protocols::raw_connect::ProxyDigest) {
                self.inner.set_proxy_digest(digest)
            }
        }

        impl pingora::protocols::GetSocketDigest for $wrapper {
            fn get_socket_digest(
                &self,
            ) -> Option<std::sync::Arc<pingora::protocols::SocketDigest>> {
                self.inner.get_socket_digest()
            }

            fn set_socket_digest(&mut self, digest: pingora::protocols::SocketDigest) {
                self.inner.set_socket_digest(digest)
            }
        }
    };
}

pub(crate) use forward_to_inner;
