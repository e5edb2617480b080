module ghostgpu/benchmarks/exec_floor

go 1.25

require github.com/gorilla/websocket v1.5.3
