# Rate limits. Each tenant's calls to a paid API may go at 10 a second, with bursts of 2, across
# every process that runs the pipeline. A call over its tenant's limit waits for its turn where it
# is, in its tenant's order, and is never dropped; the tenants in other partitions go on meanwhile.
# The wait shows as the stage's delayed time (the progress line, the live page, the job summary and
# the flowrun.node.delayed metric).

pipeline "calls" {
  key_prefix = "calls"
}

variable "calls" {
  type    = number
  default = 30
}

topic "calls" {
  partitions = 4
  key        = msg.tenant
}

source "calls" {
  kind   = "generate"
  count  = var.calls
  output = topic.calls
  template = {
    id     = "call-${index}"
    tenant = "tenant-${index % 3}"
  }
}

stage "throttle" {
  kind  = "rate_limit"
  input = topic.calls
  key   = msg.tenant
  rate  = 10
  per   = "1s"
  burst = 2
}

sink "api" {
  kind  = "stdout"
  input = stage.throttle
}
