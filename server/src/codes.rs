//! The gRPC status codes the specification gives for requests the transport
//! refuses, where tonic answers others: a request over the size limit is
//! `RESOURCE_EXHAUSTED` (tonic says `OUT_OF_RANGE`), and bytes that are not
//! the request's protobuf are `INVALID_ARGUMENT` (tonic says `INTERNAL`,
//! which tells a client the server broke). Clients retry or report by code,
//! so the code matters more than the message, which is kept.

use tonic::codegen::{BoxFuture, Context, Poll, Service, http};
use tonic::server::NamedService;
use tonic::{Code, Status};

/// A gRPC service whose refusals carry the specification's codes.
#[derive(Clone)]
pub(crate) struct StandardCodes<S>(pub S);

impl<S: NamedService> NamedService for StandardCodes<S> {
    const NAME: &'static str = S::NAME;
}

impl<S, B> Service<http::Request<B>> for StandardCodes<S>
where
    S: Service<http::Request<B>, Response = http::Response<tonic::body::Body>>,
    S::Future: Send + 'static,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = BoxFuture<Self::Response, Self::Error>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.0.poll_ready(cx)
    }

    fn call(&mut self, request: http::Request<B>) -> Self::Future {
        let answered = self.0.call(request);
        Box::pin(async move { answered.await.map(standard) })
    }
}

/// `response` with the specification's code, if it is a refusal tonic coded otherwise.
fn standard(response: http::Response<tonic::body::Body>) -> http::Response<tonic::body::Body> {
    let Some(status) = Status::from_header_map(response.headers()) else { return response };
    match standard_code(&status) {
        Some(code) => Status::new(code, status.message()).into_http(),
        None => response,
    }
}

fn standard_code(status: &Status) -> Option<Code> {
    match status.code() {
        Code::OutOfRange if status.message().contains("message length too large") => {
            Some(Code::ResourceExhausted)
        }
        Code::Internal if status.message().contains("failed to decode Protobuf message") => {
            Some(Code::InvalidArgument)
        }
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_transports_refusals_are_recoded() {
        let too_large = Status::out_of_range(
            "Error, decoded message length too large: found 9 bytes, the limit is: 8 bytes",
        );
        assert_eq!(standard_code(&too_large), Some(Code::ResourceExhausted));
        let garbage = Status::internal("failed to decode Protobuf message: invalid varint");
        assert_eq!(standard_code(&garbage), Some(Code::InvalidArgument));
        assert_eq!(standard_code(&Status::internal("the store task failed")), None);
        assert_eq!(standard_code(&Status::out_of_range("something else")), None);
    }
}
