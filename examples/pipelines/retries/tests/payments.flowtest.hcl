# Tests of the payments pipeline: what reaches the ledger, what is dead-lettered and why.

run "payments reach the ledger" {
  send {
    source = source.payments
    messages = [
      { id = "pay-1", account = "acct-1", amount = "15" },
      { id = "pay-2", account = "acct-2", amount = "25" },
    ]
  }
  expect {
    sink  = sink.ledger
    match = "unordered"
    messages = [
      { id = "pay-1", account = "acct-1", amount_cents = 1500 },
      { id = "pay-2", account = "acct-2", amount_cents = 2500 },
    ]
  }
}

run "an amount that is not a number is dead-lettered at once" {
  send {
    source   = source.payments
    messages = [{ id = "pay-3", account = "acct-3", amount = "n/a" }]
  }
  expect {
    sink  = sink.ledger
    count = 0
  }
  expect {
    sink  = sink.failures
    count = 1
  }
  assert {
    condition     = metrics.validate.dead_lettered == 1 && metrics.validate.retries == 0
    error_message = "a bad amount is given up on its first attempt"
  }
}
