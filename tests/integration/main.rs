mod api_objects;
mod daemon;
mod imagepulljob;
mod manager;
mod node_infra;
mod nodeimage;
mod smoke;
mod support;
