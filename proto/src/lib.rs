tonic::include_proto!("leasehold.v1");
