#!/usr/bin/python3
"""Submits a ZeroTrain job and watches it, knowing nothing but the .proto files.

The control plane is plain gRPC: this client compiles proto/job.proto and proto/control.proto
with protoc and Debian's grpc_python_plugin at start-up, builds a JobSpec from a JSON job file
through protobuf's JSON mapping, and calls JobService.SubmitJob and JobService.WatchJob with the
coordinator's bearer token.

    examples/python/zt_client.py --coordinator 127.0.0.1:7070 --token-file STATE/token JOB.json

Prints one line per job event and the final state; exits 0 only when the job SUCCEEDED.
Needs python3-grpcio, python3-protobuf and protobuf-compiler-grpc (Debian packages).
"""
import argparse
import importlib
import os
import subprocess
import sys
import tempfile

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def compile_protos(proto_dir, out_dir):
    """Generates job_pb2, control_pb2 and control_pb2_grpc into out_dir and imports them."""
    subprocess.run(
        ["protoc", f"-I{proto_dir}", f"--python_out={out_dir}", f"--grpc_python_out={out_dir}",
         "--plugin=protoc-gen-grpc_python=/usr/bin/grpc_python_plugin",
         os.path.join(proto_dir, "job.proto"), os.path.join(proto_dir, "control.proto")],
        check=True)
    sys.path.insert(0, out_dir)
    return (importlib.import_module("job_pb2"), importlib.import_module("control_pb2"),
            importlib.import_module("control_pb2_grpc"))


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("job", help="job file in JSON (the JobSpec's JSON mapping)")
    parser.add_argument("--coordinator", default=os.environ.get("ZT_COORDINATOR", "127.0.0.1:7070"))
    parser.add_argument("--token-file", required=True)
    parser.add_argument("--proto-dir", default=os.path.join(REPO, "proto"))
    args = parser.parse_args()

    import grpc
    from google.protobuf import json_format

    with tempfile.TemporaryDirectory() as out_dir:
        job_pb2, control_pb2, control_grpc = compile_protos(args.proto_dir, out_dir)
        with open(args.token_file) as f:
            metadata = [("authorization", "Bearer " + f.read().strip())]
        with open(args.job) as f:
            spec = json_format.Parse(f.read(), job_pb2.JobSpec())

        channel = grpc.insecure_channel(args.coordinator, options=[("grpc.enable_http_proxy", 0)])
        jobs = control_grpc.JobServiceStub(channel)
        try:
            job = jobs.SubmitJob(control_pb2.SubmitJobRequest(spec=spec), metadata=metadata,
                                 timeout=30)
        except grpc.RpcError as e:
            print(f"submit: {e.code().name}: {e.details()}", file=sys.stderr)
            return 2
        print(f"submitted {job.id}")
        state = job.state
        for event in jobs.WatchJob(control_pb2.WatchJobRequest(job_id=job.id), metadata=metadata):
            state = event.state
            if event.progress.step:
                print(f"step {event.progress.step}/{event.progress.max_steps} "
                      f"loss {event.progress.loss:.4f}")
            if event.message:
                print(f"{control_pb2.Job.State.Name(event.state)}: {event.message}")
        print(f"final state: {control_pb2.Job.State.Name(state)}")
        return 0 if state == control_pb2.Job.SUCCEEDED else 1


if __name__ == "__main__":
    sys.exit(main())
