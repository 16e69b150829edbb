"""A generation's events on the channel layer: publishing with a replay buffer (`streams`), and the
protocol a follower (the chat socket, the API's server-sent events) uses to receive each exactly
once, in order."""
