from django.dispatch import Signal

# A tool call ended (orchestration.tools.loop): `name`, `outcome` (an Outcome's value) and `seconds`.
# For counting only (observability's metrics); nothing waits on a receiver.
tool_call_ended = Signal()
