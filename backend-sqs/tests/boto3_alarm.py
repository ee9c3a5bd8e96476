"""CloudWatch alarms as an operator makes them, with boto3 (the official AWS SDK), for the
doctor's alarm rule. Run by tests/doctor.rs against moto.

    boto3_alarm.py put NAME METRIC QUEUE [ACTION]   an alarm on METRIC of QUEUE (Maximum > 0)
    boto3_alarm.py delete NAME
"""

import os
import sys

import boto3

cloudwatch = boto3.client(
    "cloudwatch",
    endpoint_url=os.environ["REDRIVE_SQS_ENDPOINT"],
    region_name=os.environ.get("AWS_REGION", "us-east-1"),
    aws_access_key_id=os.environ.get("AWS_ACCESS_KEY_ID", "test"),
    aws_secret_access_key=os.environ.get("AWS_SECRET_ACCESS_KEY", "test"),
)

if sys.argv[1] == "put":
    name, metric, queue = sys.argv[2:5]
    actions = sys.argv[5:6]
    cloudwatch.put_metric_alarm(
        AlarmName=name,
        Namespace="AWS/SQS",
        MetricName=metric,
        Dimensions=[{"Name": "QueueName", "Value": queue}],
        Statistic="Maximum",
        Period=60,
        EvaluationPeriods=1,
        Threshold=0,
        ComparisonOperator="GreaterThanThreshold",
        AlarmActions=actions,
    )
elif sys.argv[1] == "delete":
    cloudwatch.delete_alarms(AlarmNames=[sys.argv[2]])
else:
    sys.exit(f"unknown command {sys.argv[1]}")
