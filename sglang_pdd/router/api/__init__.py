"""The router's front door: what a client may send (admission, client keys, connection and in-flight
caps), and the OpenAI layers over the stitched stream (`openai/`)."""
