//! The doctor's alarm rule (`sqs.dlq-alarm`): the CloudWatch alarms on the dead-letter queue,
//! read with `DescribeAlarms` over AWS JSON 1.0, signed here with SigV4. The Rust CloudWatch SDK
//! speaks only Smithy RPC v2 CBOR, which moto (the tests' AWS) cannot parse; CloudWatch still
//! takes JSON 1.0.

use std::time::{Duration, SystemTime};

use aws_config::SdkConfig;
use aws_sdk_sqs::config::ProvideCredentials;
use aws_sigv4::http_request::{SignableBody, SignableRequest, SigningSettings, sign};
use aws_sigv4::sign::v4;
use redrive_core::doctor::Check;
use redrive_core::{Error, ErrorKind, Result};
use serde_json::{Value, json};

/// The metric that counts messages waiting in a queue: what an alarm on a DLQ must watch.
const VISIBLE: &str = "ApproximateNumberOfMessagesVisible";
/// The metric that counts what producers send; the redrive policy's moves are not sends.
const SENT: &str = "NumberOfMessagesSent";
/// The most pages of alarms read.
const MAX_PAGES: usize = 20;

/// One alarm's metrics on an SQS queue, and whether it tells anyone.
#[derive(Debug, Clone, PartialEq)]
pub(super) struct Alarm {
    pub(super) name: String,
    /// `(metric, queue)` of each SQS metric it watches (metric math included).
    pub(super) metrics: Vec<(String, String)>,
    /// Enabled, with at least one alarm action.
    pub(super) acts: bool,
}

fn unsigned(e: impl std::error::Error + Send + Sync + 'static) -> Error {
    Error::new(ErrorKind::Config, "cannot sign the alarms request").with_source(e)
}

/// Every alarm of the account and region (CloudWatch's `DescribeAlarms`, paged).
pub(super) async fn describe(config: &SdkConfig, endpoint: Option<&str>) -> Result<Vec<Alarm>> {
    let region = config.region().map_or("us-east-1", |r| r.as_ref()).to_owned();
    let endpoint = endpoint.map_or_else(|| format!("https://monitoring.{region}.amazonaws.com"), str::to_owned);
    let provider = config
        .credentials_provider()
        .ok_or_else(|| Error::new(ErrorKind::Config, "no AWS credentials to read the alarms with"))?;
    let credentials = provider
        .provide_credentials()
        .await
        .map_err(|e| Error::new(ErrorKind::Config, "no AWS credentials to read the alarms with").with_source(e))?;
    let identity = credentials.into();
    let http = reqwest::Client::builder()
        .timeout(Duration::from_secs(10))
        .build()
        .map_err(|e| Error::new(ErrorKind::Config, "could not build the HTTP client").with_source(e))?;
    let mut alarms = Vec::new();
    let mut token: Option<String> = None;
    for _ in 0..MAX_PAGES {
        let body = match &token {
            Some(token) => json!({ "NextToken": token }),
            None => json!({}),
        }
        .to_string();
        let headers = [
            ("content-type", "application/x-amz-json-1.0"),
            ("x-amz-target", "GraniteServiceVersion20100801.DescribeAlarms"),
        ];
        let params = v4::SigningParams::builder()
            .identity(&identity)
            .region(&region)
            .name("monitoring")
            .time(SystemTime::now())
            .settings(SigningSettings::default())
            .build()
            .map_err(unsigned)?
            .into();
        let signable =
            SignableRequest::new("POST", endpoint.as_str(), headers.into_iter(), SignableBody::Bytes(body.as_bytes()))
                .map_err(unsigned)?;
        let (instructions, _) = sign(signable, &params).map_err(unsigned)?.into_parts();
        let mut request = http.post(&endpoint).body(body);
        for (name, value) in headers.into_iter().chain(instructions.headers()) {
            request = request.header(name, value);
        }
        let response = request.send().await.map_err(|_| Error::temporary("CloudWatch DescribeAlarms: no answer"))?;
        let status = response.status();
        let page: Value = response.json().await.unwrap_or(Value::Null);
        if !status.is_success() {
            let code = page["__type"].as_str().unwrap_or_default().rsplit('#').next().unwrap_or_default().to_owned();
            let kind = if matches!(status.as_u16(), 401 | 403) || code.contains("AccessDenied") {
                ErrorKind::Config
            } else {
                ErrorKind::Backend
            };
            return Err(Error::new(kind, format!("CloudWatch DescribeAlarms answered {status} {code}")));
        }
        alarms.extend(page["MetricAlarms"].as_array().into_iter().flatten().map(alarm));
        token = page["NextToken"].as_str().filter(|t| !t.is_empty()).map(str::to_owned);
        if token.is_none() {
            break;
        }
    }
    Ok(alarms)
}

/// An alarm as `DescribeAlarms` gives it: its own metric, or each of its metric math's.
fn alarm(value: &Value) -> Alarm {
    let sqs_metric = |metric: &Value| {
        let queue = metric["Dimensions"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|d| d["Name"] == "QueueName")
            .and_then(|d| d["Value"].as_str());
        match (metric["Namespace"].as_str(), metric["MetricName"].as_str(), queue) {
            (Some("AWS/SQS"), Some(name), Some(queue)) => Some((name.to_owned(), queue.to_owned())),
            _ => None,
        }
    };
    let math = value["Metrics"].as_array().into_iter().flatten().map(|m| &m["MetricStat"]["Metric"]);
    Alarm {
        name: value["AlarmName"].as_str().unwrap_or_default().to_owned(),
        metrics: std::iter::once(value).chain(math).filter_map(sqs_metric).collect(),
        acts: value["ActionsEnabled"].as_bool().unwrap_or(true)
            && value["AlarmActions"].as_array().is_some_and(|a| !a.is_empty()),
    }
}

/// The rule: an alarm that acts on the DLQ's visible messages passes; alarms only on what is
/// sent to it fail (the redrive policy's moves are not sends, so it never fires); none, or none
/// that acts, warns (the workers' sinks still alert once the records are drained).
pub(super) fn rule(dlq: &str, alarms: Result<Vec<Alarm>>) -> Check {
    const RULE: &str = "sqs.dlq-alarm";
    let alarms = match alarms {
        Ok(alarms) => alarms,
        Err(e) => {
            return Check::warn(
                RULE,
                format!("cannot read the CloudWatch alarms: {e}"),
                "grant cloudwatch:DescribeAlarms to whoever runs the doctor",
            );
        }
    };
    let on = |metric: &str| {
        alarms.iter().filter(|a| a.metrics.iter().any(|(m, q)| m == metric && q == dlq)).collect::<Vec<_>>()
    };
    let (visible, sent) = (on(VISIBLE), on(SENT));
    if let Some(alarm) = visible.iter().find(|a| a.acts) {
        Check::pass(RULE, format!("alarm {} watches {VISIBLE} on {dlq}", alarm.name))
    } else if !sent.is_empty() && visible.is_empty() {
        Check::fail(
            RULE,
            format!(
                "the alarms on {dlq} watch {SENT}, which never counts the messages the redrive policy moves: \
                 they never fire"
            ),
            format!("alarm on {VISIBLE} of {dlq} (Maximum > 0, with an action)"),
        )
    } else if !visible.is_empty() {
        Check::warn(
            RULE,
            format!("the alarm on {VISIBLE} of {dlq} has no enabled action: nobody hears it"),
            "enable its actions and give it one (an SNS topic that pages)",
        )
    } else {
        Check::warn(
            RULE,
            format!("no CloudWatch alarm on {dlq}: a message moved there is seen once a worker drains it"),
            format!("alarm on {VISIBLE} of {dlq} (Maximum > 0, with an action)"),
        )
    }
}

#[cfg(test)]
mod tests {
    use redrive_core::doctor::Status;

    use super::*;

    fn described(metric: &str, queue: &str, actions: &[&str]) -> Alarm {
        alarm(&json!({
            "AlarmName": "a", "Namespace": "AWS/SQS", "MetricName": metric,
            "Dimensions": [{"Name": "QueueName", "Value": queue}],
            "ActionsEnabled": true, "AlarmActions": actions,
        }))
    }

    #[test]
    fn an_alarm_on_visible_messages_that_acts_passes_and_one_on_sends_fails() {
        let sns = ["arn:aws:sns:us-east-1:1:page"];
        assert_eq!(rule("q-dlq", Ok(vec![described(VISIBLE, "q-dlq", &sns)])).status, Status::Pass);
        assert_eq!(rule("q-dlq", Ok(vec![described(SENT, "q-dlq", &sns)])).status, Status::Fail);
        assert_eq!(rule("q-dlq", Ok(vec![described(VISIBLE, "q-dlq", &[])])).status, Status::Warn);
        assert_eq!(rule("q-dlq", Ok(vec![described(VISIBLE, "other", &sns)])).status, Status::Warn);
        assert_eq!(rule("q-dlq", Err(Error::new(ErrorKind::Config, "denied"))).status, Status::Warn);
    }

    #[test]
    fn metric_math_alarms_are_read() {
        let math = alarm(&json!({
            "AlarmName": "m", "ActionsEnabled": true, "AlarmActions": ["x"],
            "Metrics": [{"Id": "m1", "MetricStat": {"Metric": {
                "Namespace": "AWS/SQS", "MetricName": VISIBLE,
                "Dimensions": [{"Name": "QueueName", "Value": "q-dlq"}]}}}],
        }));
        assert_eq!(math.metrics, [(VISIBLE.to_owned(), "q-dlq".to_owned())]);
    }
}
