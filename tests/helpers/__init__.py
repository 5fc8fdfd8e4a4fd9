"""What the tests share, one module per concern: paths, sample archives (models), running servers
(servers), memory limits (cgroups), the tsctl engine as a process (engine, engine_limits), small models for
hostile inputs (hostile), zip surgery (zips), pytorch/serve's kserve_wrapper (kserve_wrapper), tritonclient's
gRPC client in a process of its own (grpc_client) and DEPLOY.md's blocks run against stubs (deploy_md).
Fixtures stay in tests/conftest.py."""
