//! `PushUrls`: an A2A Partner's request handing the agent a push-notification URL is
//! refused (`push_url_refused`) unless every such URL passes the Partner's policy
//! (`crate::a2a::push`). After `Policy` and `Owners`, so a caller is judged (identity,
//! access rules, task ownership) before any name is resolved for it. A body that names
//! no push config passes without a second parse; an AIP Partner's without a look.

use bytes::Bytes;

use super::ask::Ask;
use super::exchange::{Exchange, Refusal};
use super::facts::Parsed;
use crate::a2a::push::{self, PushPolicy, PushUrl, Unreadable};
use crate::error::GatewayError;

/// The step (see the module documentation).
pub(crate) enum PushUrlsStep {}

impl Ask<Parsed> for PushUrlsStep {
    type Plan = (std::sync::Arc<PushPolicy>, Result<Vec<PushUrl>, Unreadable>);

    fn plan(x: &mut Exchange<Bytes, Parsed>) -> Option<Self::Plan> {
        let policy = x.facts.route.partner.config.a2a_push.as_ref()?;
        let found = push::find(&x.body)?;
        Some((policy.clone(), found))
    }

    async fn ask(
        x: Exchange<Bytes, Parsed>,
        (policy, found): Self::Plan,
    ) -> Result<Exchange<Bytes, Parsed>, Refusal> {
        let urls = match found {
            Ok(urls) => urls,
            Err(Unreadable(problem)) => {
                return Err(x.refuse(GatewayError::PushUrlRefused {
                    field: "params",
                    url: String::new(),
                    problem,
                }))
            }
        };
        for u in urls {
            if let Err(problem) = policy.check(&u.url).await {
                return Err(x.refuse(GatewayError::PushUrlRefused {
                    field: u.field,
                    url: u.url,
                    problem,
                }));
            }
        }
        Ok(x)
    }
}
