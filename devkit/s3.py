"""A staging bucket on the local moto server (tests, `make local`), as template.yaml makes.

The moto server of devkit.sqs serves S3 on the same port as SQS; boto3 finds it through
AWS_ENDPOINT_URL_S3, like the archive function does.
"""

from __future__ import annotations

import contextlib
from typing import Any


def create_bucket(client: Any, name: str, *, versioned: bool = False) -> str:
    """Create `name` (us-east-1: no location constraint), versioned if asked (what
    template.yaml's OriginalsBucket is), and return it."""
    client.create_bucket(Bucket=name)
    if versioned:
        client.put_bucket_versioning(Bucket=name, VersioningConfiguration={"Status": "Enabled"})
    return name


def object_versions(client: Any, bucket: str) -> list[tuple[str, str]]:
    """(key, version id) of every version in the bucket, delete markers left out."""
    response = client.list_object_versions(Bucket=bucket)
    return sorted((str(v["Key"]), str(v["VersionId"])) for v in response.get("Versions", []))


def staged_keys(client: Any, bucket: str) -> list[str]:
    """The keys in the bucket (a test bucket holds a handful; no paging needed)."""
    response = client.list_objects_v2(Bucket=bucket)
    return sorted(str(item["Key"]) for item in response.get("Contents", []))


def remove_bucket(client: Any, bucket: str) -> None:
    """Empty and delete the bucket; a bucket already gone is fine."""
    with contextlib.suppress(Exception):
        for key in staged_keys(client, bucket):
            client.delete_object(Bucket=bucket, Key=key)
        response = client.list_object_versions(Bucket=bucket)
        for version in response.get("Versions", []) + response.get("DeleteMarkers", []):
            client.delete_object(Bucket=bucket, Key=version["Key"], VersionId=version["VersionId"])
        uploads = client.list_multipart_uploads(Bucket=bucket).get("Uploads", [])
        for upload in uploads:
            client.abort_multipart_upload(
                Bucket=bucket, Key=upload["Key"], UploadId=upload["UploadId"]
            )
        client.delete_bucket(Bucket=bucket)
