"""`ghostgpu bench scale`: what one poll of the controller costs at N = 100 ... 10,000
tracked GPU pods on the local control plane, beside a naive cron-script baseline.

Modules: `fleet` (kwok nodes, namespaces, bare GPU pods, the exec table), `exporter` (an N-series
dcgm-exporter look-alike and the real Prometheus scraping it), `probe` (the real controller's poll
loop in a subprocess, instrumented from outside the controller code), `naive` (the baseline),
`report` (table and log-log plot), `bench` (the orchestration).
"""
