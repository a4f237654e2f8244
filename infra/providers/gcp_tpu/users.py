"""What a job on a gcp-tpu cluster can reach (issue 29), as `plan` and `status` say it.

Not separated yet: Ray still runs as the image's SSH user, who has passwordless sudo, and the
metadata server answers every process of a node. NOTES.md ("What a job can reach") says what the
separation will be and why it is not done; this line must change with it.
"""

from __future__ import annotations

#: What `plan` and `status` print about a job on a gcp-tpu cluster.
JOB_REACH = ("jobs run as the SSH user, with sudo, and can ask the metadata server for the head's "
             "service-account token (Compute Admin on the project): not separated yet on gcp-tpu "
             "(infra/providers/gcp_tpu/NOTES.md)")
