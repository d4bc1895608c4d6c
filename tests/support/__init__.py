"""What the tests stand on: real receivers (SMTP, HTTP), cuts and their truth, the chaos
harness, a fork server, and the test apps (tools that record their runs, a page limit)."""
