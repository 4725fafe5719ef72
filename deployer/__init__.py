"""tfdeploy control side: plan, push, start, watch and tear down TensorFlow clusters."""
